"""FedAsync's and FedBuff's server steps on hand-computed cases: each update kept until the version it arrives at,
weighted by its staleness; a round without an upload still takes the step kept updates make; the kept updates
saved and restored with the state."""

from __future__ import annotations

import numpy as np
import pytest

from rayfed.algorithms import ClientVectors, sum_contributions
from rayfed.algorithms.common.asynchronous import KeptUpdatesServer, staleness_weight
from rayfed.algorithms.fedasync import FedAsyncParams, FedAsyncServer
from rayfed.algorithms.fedbuff import FedBuffParams, FedBuffServer
from rayfed.execution.round_facts import RoundFacts
from rayfed.execution.server import Server
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec


def _spec(size: int) -> ProblemSpec:
    layout = ParamLayout(("w",), ((size,),), (0, size))
    return ProblemSpec(4, 2, (1, 2, 2), {"m": layout}, {"m": ("w",)}, {"m": "w"}, default_architecture="m")


def _uploads(models: dict[int, list[float]]) -> ClientVectors:
    return sum_contributions(ClientVectors.of(np.array(m, np.float32), cid, 1.0) for cid, m in models.items())


def _ctx(version: int, arrives: dict[int, int]) -> RoundFacts:
    ids = np.array(sorted(arrives), np.int64)
    return RoundFacts(
        round=version, seed=0, lr=0.1, sampled=ids, arrives_at=np.array([arrives[i] for i in ids], np.int64)
    )


def _arrive(half: KeptUpdatesServer, version: int, arrives: dict[int, int], uploads: ClientVectors) -> dict:
    """The half's aggregation of round ``version`` as the server asks it: each upload with its arrival."""
    ctx = _ctx(version, arrives)
    return half.aggregate_arriving(ctx, uploads, ctx.arrives_at)


def _fedbuff(**params: object) -> FedBuffServer:
    params = {"concurrency": 3, "buffer_size": 2, "server_lr": 1.0, **params}
    return FedBuffServer(FedBuffParams(**params), _spec(2), {"m": np.zeros(2, np.float32)})  # type: ignore[arg-type]


def test_staleness_functions_follow_fedasync() -> None:
    lag = np.array([0, 1, 3])
    assert staleness_weight(lag, "constant", 0.5, 0).tolist() == [1.0, 1.0, 1.0]
    np.testing.assert_allclose(staleness_weight(lag, "polynomial", 0.5, 0), [1, 2**-0.5, 0.5])
    np.testing.assert_allclose(staleness_weight(lag, "hinge", 2.0, 1), [1, 1, 1 / 5])


def test_fedbuff_steps_with_the_buffers_staleness_weighted_mean_delta() -> None:
    # Prepare: from θ_0 = 0, client 1 arrives at version 1, clients 2 and 3 at version 2 (staleness 1)
    server = _fedbuff()
    # Execute: round 0 keeps the three updates and makes version 1 from client 1's alone
    first = _arrive(server, 0, {1: 1, 2: 2, 3: 2}, _uploads({1: [2.0, 0.0], 2: [0.0, 4.0], 3: [4.0, 4.0]}))
    after_one = server.global_vector.copy()
    # then round 1's launches all arrive later; version 2 is the kept mean of Δ_2, Δ_3 weighted 1/√2
    second = _arrive(server, 1, {4: 3}, _uploads({4: [0.0, 0.0]}))
    # Assert: θ_1 = 0 − (0 − [2, 0]) / 1; θ_2 = θ_1 − (s(1) (0 − [0, 4]) + s(1) (0 − [4, 4])) / 2
    np.testing.assert_allclose(after_one, [2.0, 0.0])
    np.testing.assert_allclose(server.global_vector, [2.0 + 2.0 * 2**-0.5, 4.0 * 2**-0.5], rtol=1e-6)
    assert first["clients_aggregated"] == 1.0 and second["clients_aggregated"] == 2.0
    assert second["fedbuff_mean_weight"] == pytest.approx(2**-0.5)
    assert sorted(server.kept) == [3]


def test_fedasync_mixes_each_update_with_alpha_times_its_staleness_weight() -> None:
    params = FedAsyncParams(concurrency=2, alpha=0.5, staleness="polynomial", staleness_a=1.0)
    server = FedAsyncServer(params, _spec(1), {"m": np.array([1.0], np.float32)})
    _arrive(server, 0, {1: 1, 2: 2}, _uploads({1: [3.0], 2: [5.0]}))
    np.testing.assert_allclose(server.global_vector, [2.0])  # (1 − ½) 1 + ½ 3
    _arrive(server, 1, {3: 3}, _uploads({3: [0.0]}))
    np.testing.assert_allclose(server.global_vector, [0.75 * 2.0 + 0.25 * 5.0])  # α s(1) = ½ · ½


def test_a_round_without_an_acceptable_upload_still_takes_the_step_its_kept_updates_make(tmp_path) -> None:
    # Prepare: the server shell over FedBuff, with updates kept for version 2; round 1's one call brings nothing
    # (its only client's update was not finite, which its worker's settlement leaves out: rayfed.execution.settlement)
    server = Server.__new__(Server)
    server.half = _fedbuff()
    server.aggregate(_ctx(0, {1: 1, 2: 2, 3: 2}), _uploads({1: [2.0, 0.0], 2: [0.0, 4.0], 3: [4.0, 4.0]}))
    # Execute
    metrics = server.aggregate(_ctx(1, {4: 3}), None)
    # Assert: version 2 made from the two kept updates; nothing new kept
    assert metrics["clients_aggregated"] == 2.0 and metrics["server_bytes_received"] == 0
    np.testing.assert_allclose(server.half.global_vector, [2.0 + 2.0 * 2**-0.5, 4.0 * 2**-0.5], rtol=1e-6)
    assert server.half.kept == {}


def test_kept_updates_are_saved_and_restored_with_the_state() -> None:
    server = _fedbuff()
    _arrive(server, 0, {1: 2, 2: 3, 3: 3}, _uploads({1: [1.0, 0.0], 2: [0.0, 1.0], 3: [1.0, 1.0]}))
    restored = _fedbuff()
    restored.load_state_dict(server.state_dict())
    assert sorted(restored.kept) == [2, 3] and restored.kept[3][1:] == server.kept[3][1:] == (
        2 * 3**-0.5,
        2,
    )  # staleness 2
    assert all(np.array_equal(restored.kept[v][0], server.kept[v][0]) for v in (2, 3))
    assert len(server.state_dict()) == len(_fedbuff().state_dict()) + 3  # a fresh server keeps nothing


def test_with_privacy_a_rejected_launch_is_a_zero_update_and_each_step_is_noised_for_its_heaviest_client() -> None:
    # Prepare: a protected FedBuff whose noise records each step's bound and adds 1 to every coordinate; round 0
    # launches clients 1 and 2 (arriving at version 1) and client 3 (version 2), client 2's update rejected
    server, bounds = _fedbuff(staleness="polynomial"), []

    def noise(round_index: int, size: int, bound: float) -> np.ndarray:
        bounds.append((round_index, bound))
        return np.ones(size, np.float32)

    server.protect(noise)
    # Execute: round 0 keeps Δ_1, client 2's zero update and Δ_3; round 1's launch of client 3 arrives at version 2
    _arrive(server, 0, {1: 1, 2: 1, 3: 2}, _uploads({1: [-2.0, 0.0], 3: [0.0, -4.0]}))
    first = server.global_vector.copy()
    _arrive(server, 1, {3: 2}, _uploads({3: [0.0, 2.0]}))
    restored = _fedbuff()
    restored.load_state_dict(server.state_dict())
    # Assert: version 1 is θ_0 − (Δ_1 + 0 + noise) / 2 with Δ_1 = θ_0 − y_1 = (2, 0): the planned K = 2 (the
    # rejected launch counted as a zero update), not the one that arrived
    np.testing.assert_allclose(first, [-1.5, -0.5], rtol=1e-6)
    # each step's bound: one update of weight 1 at step 0; client 3's two updates at step 1 (staleness 1 and 0)
    assert bounds[0] == (0, 1.0) and bounds[1] == pytest.approx((1, 2**-0.5 + 1.0))
    assert server.state_dict().keys() == restored.state_dict().keys()


def test_with_privacy_the_weights_of_a_kept_step_are_saved_and_restored() -> None:
    server = _fedbuff()
    server.protect(lambda round_index, size, bound: None)
    _arrive(server, 0, {1: 1, 2: 1, 3: 2}, _uploads({1: [1.0, 0.0], 2: [0.0, 1.0], 3: [1.0, 1.0]}))
    restored = _fedbuff()
    restored.protect(lambda round_index, size, bound: None)
    restored.load_state_dict(server.state_dict())
    assert restored.weights_of == server.weights_of == {2: {3: 2**-0.5}}
