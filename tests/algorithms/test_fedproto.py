"""FedProto: prototype aggregation, the prototype term's pull, bytes, partial participation, feature widths."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayfed import ConfigError, RunConfig
from rayfed.algorithms import RoundContext
from rayfed.algorithms.fedproto import ClassSums, FedProtoParams, FedProtoServer, class_sums
from rayfed.engine import Simulation
from rayfed.execution.client_runner import ClientRunner
from rayfed.train.evaluate import features_before_output
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec
from tests.algorithms.read_back import settled
from tests.conftest import tiny_overrides


def _spec(widths: dict[str, int], k: int = 3) -> ProblemSpec:
    layouts = {
        a: ParamLayout(("fc.weight", "fc.bias"), ((k, d), (k,)), (0, k * d, k * d + k)) for a, d in widths.items()
    }
    return ProblemSpec(
        4,
        k,
        (1, 1, 1),
        layouts,
        {a: ("fc",) for a in widths},
        {a: "fc" for a in widths},
        client_architectures=tuple(widths),
        default_architecture=next(iter(widths)),
    )


@pytest.mark.parametrize("aggregation", ["client_mean", "count"])
def test_server_prototypes_are_class_means_and_absent_classes_keep_theirs(aggregation: str) -> None:
    # Prepare: two clients' embeddings (d = 2) of classes {0, 1} and {1}; class 2 had a prototype before.
    gen = torch.Generator().manual_seed(0)
    f1, y1 = torch.randn(5, 2, generator=gen), torch.tensor([0, 0, 1, 1, 1])
    f2, y2 = torch.randn(2, 2, generator=gen), torch.tensor([1, 1])
    server = FedProtoServer(FedProtoParams(aggregation=aggregation), _spec({"m": 2}), {})
    server.prototypes[2], server.present[2] = [7.0, 7.0], True
    # Execute: each client's upload from its class sums (on its device), read back once summed.
    parts = [
        ClassSums.of_client(*class_sums(f, y, 3), np.bincount(y, minlength=3) > 0) for f, y in ((f1, y1), (f2, y2))
    ]
    upload = settled(parts[0] + parts[1])
    server.aggregate(RoundContext(0, 0, 0.1, np.arange(2)), upload)
    # Assert: client_mean (authors' code): C̄(j) = mean_i C_i(j); count: Σ_i n_ij C_i(j) / Σ_i n_ij.
    c1 = [f1[y1 == j].mean(0).numpy() for j in (0, 1)]
    c2 = f2.mean(0).numpy()
    np.testing.assert_allclose(server.prototypes[0], c1[0], rtol=1e-6)
    expected = (c1[1] + c2) / 2 if aggregation == "client_mean" else (3 * c1[1] + 2 * c2) / 5
    np.testing.assert_allclose(server.prototypes[1], expected, rtol=1e-5)
    np.testing.assert_array_equal(server.prototypes[2], [7.0, 7.0])
    assert server.present.all()
    # Sent: per client a prototype (2 floats) and a count per class it holds (2 + 1), and a presence byte per class.
    assert upload.sent == 3 and upload.nbytes == 3 * (2 * 4 + 8) + 3


def test_models_with_different_feature_widths_are_refused() -> None:
    with pytest.raises(ConfigError, match="same number of features"):
        FedProtoServer.validate(FedProtoParams(), _spec({"a": 4, "b": 8}))
    FedProtoServer.validate(FedProtoParams(), _spec({"a": 4, "b": 4}))  # heterogeneous but compatible


def _distance_to_prototypes(runner: ClientRunner, result, server: FedProtoServer, ids: list[int]) -> float:
    """Mean squared distance of every training embedding to its class's global prototype."""
    total, count = 0.0, 0
    ctx = RoundContext(1, 0, runner.config.train.lr, np.arange(4))
    for cid in ids:
        job = runner.job(cid, ctx, result.states[cid], train=runner.gather(runner.partition.train(cid)))
        job.flat.load_state(runner.client_half.evaluation(server.broadcast(), job))
        layer = runner.spec.output_layer[job.architecture]
        features = torch.cat([f for _, f in features_before_output(job.model, layer, job.x_train)])
        protos = torch.from_numpy(server.prototypes)[job.y_train]
        total += float(((features - protos) ** 2).sum())
        count += int(job.y_train.shape[0])
    return total / count


def test_the_prototype_term_pulls_embeddings_towards_their_class_prototype(tmp_path) -> None:
    # Prepare: round 0 (no prototypes yet: plain CE) gives models and global prototypes.
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "fedproto",
                "data.num_clients": 4,
                "data.partition": "dirichlet",
                "data.options": {"num_samples": 600},
                "train.local_epochs": 2,
            },
        )
    )
    sim = Simulation(config)
    runner = ClientRunner(config, sim.spec, sim.dataset, sim.partition)
    ids = [0, 1, 2, 3]
    server = FedProtoServer(FedProtoParams(), sim.spec, sim.initial)
    first = runner.train(server.broadcast(), RoundContext(0, 0, config.train.lr, np.arange(4)), ids)
    server.aggregate(RoundContext(0, 0, config.train.lr, np.arange(4)), first.contribution)
    assert server.present.any()
    distances = {}
    for lam in (0.0, 1.0):
        # Execute: round 1 from the same models and prototypes, with and without the prototype term.
        runner.client_half.params = FedProtoParams(lam=lam)
        result = runner.train(server.broadcast(), RoundContext(1, 0, config.train.lr, np.arange(4)), ids, first.states)
        distances[lam] = _distance_to_prototypes(runner, result, server, ids)
    # Assert: with λ = 1 the embeddings end closer to their class prototypes than with λ = 0.
    assert distances[1.0] < 0.9 * distances[0.0]


def test_partial_participation_bytes_and_prototype_inference(tmp_path) -> None:
    # Prepare: 6 clients, half per round, evaluated by their nearest global prototype.
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "fedproto",
                "data.num_clients": 6,
                "data.partition": "dirichlet",
                "data.options": {"num_samples": 900},
                "engine.join_ratio": 0.5,
                "algorithm.params.inference": "prototype",
            },
        )
    )
    sim = Simulation(config)
    k, counts = sim.spec.num_classes, sim.partition.train_label_counts
    d = FedProtoServer(config.algorithm.params, sim.spec, sim.initial).prototypes.shape[1]
    # Execute
    result = sim.run()
    # Assert: up, a prototype and count per class held, plus a presence byte per class; round 0's download
    # carries no prototype; the evaluation is well above chance.
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    sampled = [c for c in clients if c["sampled"]]
    assert len(sampled) == 6
    for c in sampled:
        held = int((counts[c["client_id"]] > 0).sum())
        assert c["bytes_up"] == held * (4 * d + 8) + k
    assert all(c["bytes_down"] == k for c in sampled if c["round"] == 0)
    assert all(c["bytes_down"] > k and (c["bytes_down"] - k) % (4 * d) == 0 for c in sampled if c["round"] == 1)
    assert result.accuracies[-1] > 0.3
