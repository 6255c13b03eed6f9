"""CFL: the split criterion, the similarity matrix and the bipartition against direct computations; the
server's per-cluster aggregation; two label-swapped groups split apart end to end; bytes; partial participation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import ConfigError, RunConfig, run
from rayfed.algorithms import RoundContext, sum_contributions
from rayfed.algorithms.cfl import (
    CFLParams,
    CFLServer,
    ClientUpdates,
    bipartition,
    cosine_similarity_matrix,
    max_cross_similarity,
    split_criterion,
    update_norms,
)
from rayfed.algorithms.contributions import ClientVectors
from rayfed.reproduce.tables_cwfedavg import CWFEDAVG_TABLES
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec
from tests.algorithms.client_states import ServerStates
from tests.algorithms.two_groups import group_of, two_group_overrides
from tests.conftest import tiny_overrides

# A model of 6 parameters and 2 buffers.
LAYOUT = ParamLayout(("a.weight", "a.bias"), ((2, 2), (2,)), (0, 4, 6))
BUFFERS = ParamLayout(("bn.running_mean",), ((2,),), (0, 2))
P, S = LAYOUT.size, LAYOUT.size + BUFFERS.size


def _spec(num_clients: int) -> ProblemSpec:
    return ProblemSpec(
        num_clients,
        2,
        (1, 2, 2),
        {"m": LAYOUT},
        {"m": ("a",)},
        {"m": "a"},
        default_architecture="m",
        buffer_layouts={"m": BUFFERS},
    )


def _ctx(round_index: int, ids: np.ndarray, num_clients: int) -> RoundContext:
    return RoundContext(round=round_index, seed=0, lr=0.1, sampled=np.sort(ids))


def _upload(updates: np.ndarray, ids: list[int], sizes: list[float]) -> ClientVectors:
    return sum_contributions(ClientVectors.of(u, i, n) for u, i, n in zip(updates, ids, sizes))


def _brute_force_optimum(similarity: np.ndarray) -> float:
    """min over every bipartition of the max cross-cluster similarity, by enumeration."""
    m, best = len(similarity), np.inf
    for r in range(1, m):
        for part in itertools.combinations(range(m), r):
            mask = np.zeros(m, bool)
            mask[list(part)] = True
            best = min(best, similarity[np.ix_(mask, ~mask)].max())
    return best


# --- the equations against direct computations --------------------------------------------------


def test_cosine_similarity_matrix_equals_pairwise_cosines() -> None:
    # Prepare: random updates, one of them zero.
    rng = np.random.default_rng(0)
    updates = rng.normal(size=(5, 7)).astype(np.float32)
    updates[3] = 0
    # Execute
    similarity = cosine_similarity_matrix(updates)
    # Assert: each entry is <u_i, u_j> / (|u_i| |u_j|), and 0 for the zero update.
    for i, j in itertools.product(range(5), range(5)):
        a, b = updates[i].astype(np.float64), updates[j].astype(np.float64)
        expected = 0.0 if i == 3 or j == 3 else a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
        assert similarity[i, j] == pytest.approx(expected, abs=1e-12)


def test_split_criterion_uses_the_weighted_mean_update_and_the_largest_client_update() -> None:
    # Prepare: two opposite updates of sizes 1 and 3, and a third small one.
    updates = np.array([[2.0, 0.0], [-2.0, 0.0], [0.0, 0.5]])
    sizes = np.array([1.0, 3.0, 4.0])
    # Execute
    mean_norm, max_norm = update_norms(updates, sizes)
    # Assert: ‖Σ n_i Δθ_i / Σ n_i‖ and max ‖Δθ_i‖ computed by hand; then the two thresholds.
    expected_mean = np.linalg.norm((1 * updates[0] + 3 * updates[1] + 4 * updates[2]) / 8)
    assert mean_norm == pytest.approx(expected_mean) and max_norm == pytest.approx(2.0)
    assert split_criterion(mean_norm, max_norm, eps1=0.6, eps2=1.5)
    assert not split_criterion(mean_norm, max_norm, eps1=0.5, eps2=1.5)  # the cluster is not stationary
    assert not split_criterion(mean_norm, max_norm, eps1=0.6, eps2=2.0)  # no client is far from stationary


@pytest.mark.parametrize("seed", range(8))
def test_single_linkage_bipartition_is_the_optimal_one(seed: int) -> None:
    # Prepare: the similarities of random updates of 6 clients.
    rng = np.random.default_rng(seed)
    similarity = cosine_similarity_matrix(rng.normal(size=(6, 4)))
    # Execute
    leaving = bipartition(similarity, np.ones(6), "single")
    # Assert: two non-empty parts whose max cross similarity is the minimum over all bipartitions.
    assert 0 < leaving.sum() < 6
    assert max_cross_similarity(similarity, leaving) == pytest.approx(_brute_force_optimum(similarity))


@pytest.mark.parametrize("linkage", ["single", "complete"])
def test_bipartition_separates_two_groups_and_the_larger_part_stays(linkage: str) -> None:
    # Prepare: clients 0, 2, 3 push one way, 1, 4 the other (with noise); client 1 holds most samples.
    rng = np.random.default_rng(1)
    direction = rng.normal(size=8)
    signs = np.array([1, -1, 1, 1, -1])
    updates = signs[:, None] * direction + 0.3 * rng.normal(size=(5, 8))
    sizes = np.array([1.0, 10.0, 1.0, 1.0, 1.0])
    # Execute
    leaving = bipartition(cosine_similarity_matrix(updates), sizes, linkage)
    # Assert: the groups are found, and the one with more training samples keeps the cluster.
    assert leaving.tolist() == [True, False, True, True, False]


# --- the server ---------------------------------------------------------------------------------


def test_server_splits_a_stationary_cluster_and_averages_within_the_new_clusters() -> None:
    # Prepare: 5 clients of one cluster; 0, 1, 2 move along +d, 3, 4 along -d: small mean, large updates.
    server = CFLServer(CFLParams(warmup_rounds=0), _spec(5), {"m": np.arange(S, dtype=np.float32)})
    d = np.linspace(1, 2, S).astype(np.float32)
    updates = np.stack([d, 1.1 * d, 0.9 * d, -d, -1.2 * d]).astype(np.float32)
    sizes = [2.0, 1.0, 1.0, 3.0, 1.0]
    start = server.models[0].copy()
    # Execute
    metrics = server.aggregate(_ctx(0, np.arange(5), 5), _upload(updates, [0, 1, 2, 3, 4], sizes))
    # Assert: the split follows the update directions; each new cluster adds its own weighted mean update.
    assert server.assignment.tolist() == [0, 0, 0, 1, 1] and metrics["cfl_splits"] == 1
    np.testing.assert_allclose(server.models[0], start + (2 * d + 1.1 * d + 0.9 * d) / 4, rtol=1e-6)
    np.testing.assert_allclose(server.models[1], start + (-3 * d - 1.2 * d) / 4, rtol=1e-6)
    assert metrics["cfl_max_cross_similarity"] == pytest.approx(-1.0)


def test_server_does_not_split_during_warm_up_or_when_the_cluster_still_moves() -> None:
    # Prepare: the opposite updates of the test above, and updates that all agree.
    d = np.ones(S, np.float32)
    opposite = np.stack([d, d, -d, -d])
    agreeing = np.stack([d, 1.2 * d, 0.8 * d, d])
    cases = [(CFLParams(), opposite, 5), (CFLParams(warmup_rounds=0), agreeing, 0)]
    for params, updates, round_index in cases:
        server = CFLServer(params, _spec(4), {"m": np.zeros(S, np.float32)})
        # Execute
        server.aggregate(_ctx(round_index, np.arange(4), 4), _upload(updates, [0, 1, 2, 3], [1.0] * 4))
        # Assert: one cluster, FedAvg of the updates.
        assert len(server.models) == 1 and server.assignment.tolist() == [0, 0, 0, 0]
        np.testing.assert_allclose(server.models[0], updates.mean(axis=0), rtol=1e-6)


def test_partial_participation_keeps_absent_clusters_and_absent_members_in_place() -> None:
    # Prepare: clusters {0, 1, 2, 3} and {4, 5}; only 0, 1, 2 upload (opposite updates: 0 vs 1, 2).
    server = CFLServer(CFLParams(warmup_rounds=0, min_cluster_clients=3), _spec(6), {"m": np.zeros(S, np.float32)})
    server.load_state_dict({"models": np.stack([np.zeros(S), np.ones(S)]), "assignment": np.array([0, 0, 0, 0, 1, 1])})
    d = np.linspace(-1, 1, S).astype(np.float32) + 2
    # Execute
    server.aggregate(_ctx(0, np.array([0, 1, 2]), 6), _upload(np.stack([2 * d, -d, -d]), [0, 1, 2], [1.0, 1.0, 1.0]))
    # Assert: client 0 leaves; client 3, absent, stays with the larger part; cluster 1 is untouched.
    assert server.assignment.tolist() == [2, 0, 0, 0, 1, 1]
    np.testing.assert_array_equal(server.models[1], np.ones(S, np.float32))
    np.testing.assert_allclose(server.models[0], -d, rtol=1e-6)
    np.testing.assert_allclose(server.models[2], 2 * d, rtol=1e-6)


def test_gradient_norms_divide_each_update_by_its_step_length() -> None:
    # Prepare: client 0 moved far over many steps (a small gradient), client 1 a little over few (a large one),
    # client 2 opposite to 1; weights n_i = 1, 1, 2.
    d = np.ones(S, np.float32) / np.sqrt(S)
    updates = np.stack([4 * d, 0.5 * d, -0.5 * d])
    lengths = np.array([8.0, 0.25, 0.5])

    def upload() -> ClientUpdates:
        rows = (ClientVectors.of(u, i, n) for u, i, n in zip(updates, [0, 1, 2], [1.0, 1.0, 2.0]))
        return sum_contributions(
            ClientUpdates(r.blocks, r.client_ids, r.sizes, None, step_lengths=np.array([length]))
            for r, length in zip(rows, lengths)
        )

    params = {"warmup_rounds": 0, "eps1": 0.5, "eps2": 1.5}
    by_update = CFLServer(CFLParams(**params), _spec(3), {"m": np.zeros(S, np.float32)})
    by_gradient = CFLServer(CFLParams(norms="gradient", **params), _spec(3), {"m": np.zeros(S, np.float32)})
    # Execute
    plain = by_update.aggregate(_ctx(0, np.arange(3), 3), upload())
    scaled = by_gradient.aggregate(_ctx(0, np.arange(3), 3), upload())
    # Assert: the norms of Δθ_i / λ_i (‖ḡ‖ = 0.5, 2, 1; mean (0.5 + 2 − 2) / 4 = 0.125 along d): the cluster is
    # stationary and client 1 is not, so it splits; by the updates (mean 0.875, max 4) it does not. The models
    # are aggregated from the updates either way.
    mean, largest = update_norms(updates[:, :P] / lengths[:, None], np.array([1.0, 1.0, 2.0]))
    assert scaled["cfl_max_update_norm"] == pytest.approx(largest) == pytest.approx(2.0 * np.sqrt(P / S))
    assert scaled["cfl_mean_update_norm"] == pytest.approx(mean)
    assert (scaled["cfl_splits"], plain["cfl_splits"]) == (1, 0)
    assert plain["cfl_max_update_norm"] == pytest.approx(4.0 * np.sqrt(P / S))
    np.testing.assert_allclose(by_update.models[0], (updates[0] + updates[1] + 2 * updates[2]) / 4, rtol=1e-6)


def test_state_round_trips_and_broadcast_loads_each_clients_cluster_model() -> None:
    # Prepare: a server with two clusters.
    server = CFLServer(CFLParams(), _spec(3), {"m": np.zeros(S, np.float32)})
    state = {"models": np.stack([np.zeros(S), np.ones(S)]).astype(np.float32), "assignment": np.array([1, 0, 1])}
    # Execute
    server.load_state_dict(state)
    again = CFLServer(CFLParams(), _spec(3), {"m": np.zeros(S, np.float32)})
    again.load_state_dict(server.state_dict())
    # Assert
    np.testing.assert_array_equal(again.models, state["models"])
    np.testing.assert_array_equal(again.broadcast().model_of(2), np.ones(S, np.float32))


def test_defaults_are_the_papers_thresholds_and_bad_values_are_refused() -> None:
    assert (CFLParams().eps1, CFLParams().eps2) == (0.4, 0.9)
    with pytest.raises(ConfigError, match="algorithm.params.linkage"):
        CFLParams(linkage="average")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="algorithm.params.min_cluster_clients"):
        CFLParams(min_cluster_clients=1)


# --- end to end ---------------------------------------------------------------------------------


def test_the_tables_cfl_row_is_the_papers_and_the_gradient_variant_is_a_row_of_its_own() -> None:
    # The papers' criterion (raw update norms) by default; the gradient-norm variant named and labelled apart.
    for name in ("pfl-baselines-mnist", "cwfedavg-iccv-t1"):
        table = next(t for t in CWFEDAVG_TABLES if t.name == name)
        paper, gradient = CFLParams(**table.row("cfl").params), CFLParams(**table.row("cfl_gradient").params)
        assert (paper.norms, gradient.norms) == ("update", "gradient")
        assert (paper.eps1, paper.eps2, paper.warmup_rounds) == (0.4, 0.9, 20)
        assert "gradient" in table.row("cfl_gradient").label and table.row("cfl_gradient").paper == {}


def test_under_the_tables_settings_two_label_swapped_groups_split_apart_and_beat_fedavg(tmp_path) -> None:
    # Prepare: 4 clients, even ids with the original labels, odd ids with shifted ones, the tables' optimiser
    # (plain SGD, lr 0.005, batch 10) and the gradient-norm CFL row's settings. Until it splits, CFL is FedAvg
    # (one cluster, the same weighted mean of the same updates); and no single model, FedAvg's, can pass 1/2
    # here: the two groups give the images of a class two different labels.
    table = next(t for t in CWFEDAVG_TABLES if t.name == "pfl-baselines-mnist")
    cfl = table.row("cfl_gradient").params
    assert cfl["norms"] == "gradient" and CFLParams(**cfl).warmup_rounds == 20
    states = ServerStates()
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **two_group_overrides(
                **{
                    "algorithm.name": "cfl",
                    "algorithm.params": cfl,
                    "data.num_clients": 4,
                    "train.rounds": 30,
                    "data.options": {"num_samples": 2400},
                    "engine.eval_every": 5,
                }
            ),
        )
    )
    assert (config.train.lr, config.train.batch_size, config.train.momentum) == (0.005, 10, 0.0)
    # Execute
    history = run(config, callbacks=[states]).history
    # Assert: one cluster through the warm-up, then exactly the two groups within 30 rounds; FedAvg's accuracy
    # (CFL's before the split) stays near 1/2, CFL's after it clearly above.
    splits = [t for t, r in enumerate(history) if r["server_cfl_splits"]]
    assert len(splits) == 1 and 20 <= splits[0] < 30, splits
    assert states.rounds[splits[0]]["assignment"].tolist() == [group_of(c) for c in range(4)]
    before = [r["accuracy"] for r in history[: splits[0]] if not math.isnan(r["accuracy"])]
    assert max(before) < 0.55 < 0.7 < history[-1]["accuracy"]
    size = states.rounds[-1]["models"].shape[1]
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    assert {c["bytes_up"] for c in clients if c["sampled"]} == {size * 4 + 24}  # Δθ_i, id, n_i, λ_i
    assert {c["bytes_down"] for c in clients if c["sampled"]} == {size * 4}


def test_partial_participation_runs_and_keeps_unsampled_clusters(tmp_path) -> None:
    # Prepare: half the clients per round, the split opened from round 1.
    states = ServerStates()
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **two_group_overrides(
                **{
                    "algorithm.name": "cfl",
                    "data.num_clients": 8,
                    "engine.join_ratio": 0.5,
                    "train.rounds": 3,
                    "algorithm.params": {"warmup_rounds": 1, "eps1": 100.0, "eps2": 0.0},
                }
            ),
        )
    )
    # Execute
    result = run(config, callbacks=[states])
    # Assert: 4 uploads a round; a cluster none of whose members trained keeps its model.
    assert [r["server_clients_aggregated"] for r in result.history] == [4, 4, 4]
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    for t in (1, 2):
        trained = {c["client_id"] for c in clients if c["sampled"] and c["round"] == t}
        before, after = states.rounds[t - 1], states.rounds[t]
        for cluster in range(len(before["models"])):
            members = set(np.flatnonzero(after["assignment"] == cluster).tolist())
            if not members & trained:
                np.testing.assert_array_equal(after["models"][cluster], before["models"][cluster])
