"""IFCA: the cluster choice against direct losses, per-cluster sums and averages, seeded initialisations,
two label-swapped groups kept in their own clusters end to end, bytes, partial participation."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from rayfed import ConfigError, RunConfig, run
from rayfed.algorithms import RoundContext, sum_contributions
from rayfed.algorithms.ifca import (
    ClusterSums,
    IFCAClient,
    IFCAModels,
    IFCAParams,
    IFCAServer,
    choose_cluster,
    cluster_losses,
)
from rayfed.data import load_dataset, normalize_batch
from rayfed.engine import Simulation
from rayfed.engine.problem_build import build_problem
from rayfed.models import build_model
from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob
from tests.algorithms.client_states import ServerStates
from tests.algorithms.read_back import settled
from tests.algorithms.two_groups import group_of, two_group_overrides
from tests.conftest import client_job, tiny_overrides


def _job(flat: FlatModel, x: torch.Tensor, y: torch.Tensor, client_id: int = 0) -> ClientJob:
    return client_job(flat, x, y, client_id=client_id, generator=1, num_classes=3)


def _real_problem(tmp_path, num_clients: int = 4):
    config = RunConfig().override(tiny_overrides(tmp_path / "run", **{"data.num_clients": num_clients}))
    return build_problem(config, load_dataset("synthetic", None, options={"num_samples": 100}))


# --- the cluster choice -------------------------------------------------------------------------


def test_client_trains_the_cluster_model_with_the_lowest_loss_on_its_training_data() -> None:
    # Prepare: three linear models, ordered so the one with the lowest direct loss is the last.
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 4, generator=gen), torch.randint(0, 3, (30,), generator=gen)
    modules = []
    for seed in range(3):
        torch.manual_seed(seed)
        modules.append(torch.nn.Linear(4, 3))
    with torch.no_grad():
        direct = [float(F.cross_entropy(m(x), y)) for m in modules]
    modules = [modules[i] for i in np.argsort(direct)[::-1]]
    models = np.stack([FlatModel(m).state_numpy() for m in modules])
    job = _job(FlatModel(torch.nn.Linear(4, 3)), x, y)
    message, client = IFCAModels(models, np.full(1, -1), default_cluster=0), IFCAClient(None, None)
    # Execute
    job.start = client.start(message, job)
    job.flat.load_state(job.start.model)
    upload = settled(client.upload(message, job))
    # Assert: F_i(θ_j) are the direct losses (float64, on the device); argmin_j F_i(θ_j) is picked, loaded and
    # uploaded in its cluster's row alone, weighted by n_i.
    losses = cluster_losses(job, torch.from_numpy(models))
    assert losses.dtype == torch.float64
    np.testing.assert_allclose(losses.numpy(), sorted(direct, reverse=True), rtol=1e-6)
    assert int(choose_cluster(losses)) == 2 and int(choose_cluster(torch.tensor([1.0, 0.5, 0.5]))) == 1  # ties: lowest
    np.testing.assert_array_equal(job.flat.state_numpy(), models[2])
    np.testing.assert_array_equal(upload.weights, [0.0, 0.0, 30.0])
    np.testing.assert_allclose(upload.totals[2], 30 * models[2], rtol=1e-6)
    assert not upload.totals[:2].any() and upload.clusters.tolist() == [2] and upload.client_ids.tolist() == [0]


def test_evaluation_without_training_data_uses_the_last_choice_or_the_most_chosen_cluster() -> None:
    # Prepare: client 0 last chose cluster 1; client 1 never trained; cluster 2 is the most chosen.
    models = np.stack([np.full(8, float(j), np.float32) for j in range(3)])
    message = IFCAModels(models, np.array([1, -1]), default_cluster=2)
    empty_x, empty_y = torch.empty(0, 3), torch.empty(0, dtype=torch.long)
    for client, expected in ((0, 1), (1, 2)):
        job = _job(FlatModel(torch.nn.Linear(3, 2)), empty_x, empty_y, client_id=client)
        # Execute
        job.flat.load_state(IFCAClient(None, None).evaluation(message, job))
        # Assert
        np.testing.assert_array_equal(job.flat.state_numpy(), models[expected])


# --- sums and the server ------------------------------------------------------------------------


def test_cluster_sums_add_per_cluster_and_the_server_averages_each_chosen_cluster(tmp_path) -> None:
    # Prepare: a real 3-cluster server; clients 0 and 2 chose cluster 1, client 1 cluster 0.
    spec, initial = _real_problem(tmp_path)
    server = IFCAServer(IFCAParams(num_clusters=3), spec, initial)
    untouched = server.models[2].copy()
    rng = np.random.default_rng(0)
    size = server.models.shape[1]
    trained = rng.normal(size=(3, size)).astype(np.float32)
    chosen, sizes = [1, 0, 1], [10.0, 5.0, 30.0]
    parts = [
        ClusterSums.of(torch.tensor(j), torch.from_numpy(v), cid, n, 3)
        for cid, (j, v, n) in enumerate(zip(chosen, trained, sizes))
    ]
    upload = settled(sum_contributions(parts))
    # Execute
    metrics = server.aggregate(RoundContext(0, 0, 0.1, np.arange(3)), upload)
    # Assert: θ_j = Σ n_i θ̃_i / Σ n_i over its choosers; an unchosen cluster keeps its model.
    np.testing.assert_allclose(server.models[1], (10 * trained[0] + 30 * trained[2]) / 40, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(server.models[0], trained[1], rtol=1e-6)
    np.testing.assert_array_equal(server.models[2], untouched)
    assert server.assignment.tolist() == [1, 0, 1, -1] and server.broadcast().default_cluster == 1
    assert metrics["ifca_clusters_chosen"] == 2
    assert upload.nbytes == 2 * (size * 4 + 8) + 3 * 16  # two clusters summed (and each upload's id and cluster)


def test_cluster_initialisations_are_distinct_seeded_and_state_round_trips(tmp_path) -> None:
    # Prepare
    spec, initial = _real_problem(tmp_path)
    # Execute
    first, second = (IFCAServer(IFCAParams(num_clusters=3), spec, initial) for _ in range(2))
    restored = IFCAServer(IFCAParams(num_clusters=3), spec, initial)
    restored.load_state_dict({**first.state_dict(), "assignment": np.array([2, 0, -1, 1])})
    # Assert: cluster 0 is the run's initial model; the others are distinct draws, the same every time.
    np.testing.assert_array_equal(first.models, second.models)
    np.testing.assert_array_equal(first.models[0], initial[next(iter(initial))])
    assert not np.array_equal(first.models[1], first.models[2])
    assert not np.array_equal(first.models[0], first.models[1])
    np.testing.assert_array_equal(restored.models, first.models)
    assert restored.assignment.tolist() == [2, 0, -1, 1]
    with pytest.raises(ConfigError, match="algorithm.params.num_clusters"):
        IFCAParams(num_clusters=0)


# --- end to end ---------------------------------------------------------------------------------


class WarmStart(Simulation):
    """IFCA's "good initialisation" regime: cluster 1 − g starts from the run's initial model after a
    few SGD steps on group g's training data (random initialisations of this tiny problem all look
    alike to every client, and IFCA would train one cluster only; the paper restarts then)."""

    def _restore(self) -> None:
        super()._restore()
        sim = self
        assert sim.executor is not None
        state = sim.executor.server_state()
        architecture = next(iter(sim.spec.layouts))
        flat = FlatModel(build_model(architecture, sim.spec.input_shape, sim.spec.num_classes))
        models = np.array(state["models"])
        for group in (0, 1):
            flat.load_state(state["models"][0])
            indices = np.concatenate(
                [sim.partition.train(c) for c in range(sim.spec.num_clients) if group_of(c) == group]
            )
            x = normalize_batch(sim.dataset.images[indices], sim.dataset.mean, sim.dataset.std, device="cpu")
            y = torch.from_numpy(sim.dataset.labels[indices])
            optimiser = torch.optim.SGD(flat.module.parameters(), lr=0.05)
            for start in range(0, 100, 20):  # 5 steps
                optimiser.zero_grad()
                F.cross_entropy(flat.module(x[start : start + 20]), y[start : start + 20]).backward()
                optimiser.step()
            models[1 - group] = flat.state_numpy()
        sim.executor.load_server_state({**state, "models": models})


def test_two_label_swapped_groups_choose_and_keep_their_own_clusters(tmp_path) -> None:
    # Prepare: 8 clients, even ids with the original labels, odd ids with shifted ones; k = 2.
    states = ServerStates()
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **two_group_overrides(
                **{
                    "algorithm.name": "ifca",
                    "algorithm.params.num_clusters": 2,
                    "data.num_clients": 8,
                    "train.lr": 0.05,
                }
            ),
        )
    )
    # Execute
    result = WarmStart(config, callbacks=[states]).run()
    # Assert: every round each group picks the cluster warmed on its own labels, both clusters
    # train, and the clients' evaluation models improve on their own groups.
    for state in states.rounds:
        assert state["assignment"].tolist() == [1 - group_of(c) for c in range(8)]
    assert all(r["server_ifca_clusters_chosen"] == 2 for r in result.history)
    first, last = (r["accuracy"] for r in result.history)
    assert last > first and last > 0.35  # chance is 0.1
    size = states.rounds[0]["models"].shape[1]
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    assert {c["bytes_down"] for c in clients if c["sampled"]} == {2 * size * 4}  # all k models
    assert {c["bytes_up"] for c in clients if c["sampled"]} == {size * 4 + 8 + 16}  # θ̃_i, n_i, id, ĵ


def test_partial_participation_runs_and_unchosen_clusters_keep_their_models(tmp_path) -> None:
    # Prepare: the default k = 4, half the clients per round.
    states = ServerStates()
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **two_group_overrides(
                **{
                    "algorithm.name": "ifca",
                    "data.num_clients": 8,
                    "engine.join_ratio": 0.5,
                }
            ),
        )
    )
    # Execute
    result = run(config, callbacks=[states])
    # Assert: 4 uploads a round; a cluster no sampled client chose is unchanged.
    assert [r["server_clients_aggregated"] for r in result.history] == [4, 4]
    first, second = states.rounds
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    trained = [c["client_id"] for c in clients if c["sampled"] and c["round"] == 1]
    chosen = set(second["assignment"][trained].tolist())
    unchosen = [j for j in range(4) if j not in chosen]
    assert unchosen
    for j in unchosen:
        np.testing.assert_array_equal(second["models"][j], first["models"][j])
