"""Central optimisers (``rayfed.algorithms.common.central_optimizers``): a server rule that names one steps θ_g along
the pseudo-gradient as written out, and its state is saved and restored with the server's."""

from __future__ import annotations

import numpy as np

from rayfed.algorithms import RoundContext, WeightedSum
from rayfed.algorithms.common.central_optimizers import CentralOptimizer, CentralSGD
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec

LAYOUT = ParamLayout(("w",), ((4,),), (0, 4))
SPEC = ProblemSpec(3, 2, (1, 1, 2), {"m": LAYOUT}, {"m": ("w",)}, {"m": "w"}, default_architecture="m")
CTX = RoundContext(round=0, seed=0, lr=0.1, sampled=np.arange(3))


class _Momentum(FedAvgServer[None]):
    """FedAvgM: FedAvg's server with SGD momentum 0.5 and server learning rate 2."""

    def central_optimizer(self, size: int) -> CentralOptimizer:
        return CentralSGD(size, lr=2.0, momentum=0.5)


def test_a_named_central_optimizer_steps_along_the_pseudo_gradient_and_keeps_its_state() -> None:
    # Prepare
    theta = np.array([1.0, -1.0, 0.5, 0.0], np.float32)
    server = _Momentum(None, SPEC, {"m": theta})
    averages = [np.array([2.0, 0.0, 0.5, 1.0], np.float32), np.array([0.0, 1.0, -1.0, 3.0], np.float32)]
    expected, velocity = theta.astype(np.float64), np.zeros(4)
    for average in averages:
        # Execute: one client of weight 3 uploads the average.
        metrics = server.aggregate(CTX, WeightedSum.of(average, 3.0))
        # Assert: v = 0.5 v + Δ; θ = θ + 2 v; the metric is named after the method.
        delta = average - expected
        velocity = 0.5 * velocity + delta
        expected = expected + 2.0 * velocity
        np.testing.assert_allclose(server.global_vector, expected, rtol=1e-6)
        assert metrics["fedavgm_delta_norm"] == np.float32(np.linalg.norm(delta)).item()
    # The velocity is saved with θ_g and restored into a new server.
    state = server.state_dict()
    assert sorted(state) == ["global", "velocity"]
    again = _Momentum(None, SPEC, {"m": theta})
    again.load_state_dict(state)
    np.testing.assert_array_equal(again.optimizer.velocity, velocity.astype(np.float32))  # type: ignore[union-attr]


def test_fedavg_names_no_optimizer_and_saves_only_its_model() -> None:
    server = FedAvgServer(None, SPEC, {"m": np.zeros(4, np.float32)})
    assert server.optimizer is None and sorted(server.state_dict()) == ["global"]
