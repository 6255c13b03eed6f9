"""Faults: dead and hung workers, a worker that always dies, a dead server, a killed driver, non-finite or
oversized updates."""

from __future__ import annotations

import math
import os
import re
import signal
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import ray

from rayfed import RunConfig, WorkerError, run
from rayfed.actors import ray_executor, worker_pool
from rayfed.cli import main
from rayfed.engine import Simulation
from rayfed.util.errors import ServerError
from rayfed.util.files import load_arrays
from tests.conftest import tiny_overrides
from tests.killed_driver import killed_and_resumed


class _Capture:
    """A handle on the running simulation, so a test can reach its workers and server (callbacks see only
    a narrow view of a run)."""

    sim: Simulation | None = None


@pytest.fixture(autouse=True)
def _capture_simulations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record each simulation in :class:`_Capture` once its executor exists."""
    make = Simulation._make_executor

    def make_and_capture(sim: Simulation):
        executor = make(sim)
        _Capture.sim = sim
        return executor

    _Capture.sim = None
    monkeypatch.setattr(Simulation, "_make_executor", make_and_capture)


def _ray_overrides(run_dir: Path, **extra: object) -> dict[str, object]:
    return tiny_overrides(
        run_dir, **{"engine.backend": "ray", "engine.num_workers": 2, "engine.clients_per_call": 2, **extra}
    )


def _inject_once(monkeypatch: pytest.MonkeyPatch, fault) -> list[str]:
    """Run ``fault(pool)`` once, right after the first worker calls have been submitted (once a worker started)."""
    done: list[str] = []
    original_wait = ray.wait

    def wait_with_fault(refs, **kwargs):
        if not done and _Capture.sim is not None and _Capture.sim.executor.pool.workers:
            done.append(fault(_Capture.sim.executor.pool))
        return original_wait(refs, **kwargs)

    monkeypatch.setattr(worker_pool.ray, "wait", wait_with_fault)
    return done


def test_killed_worker_is_replaced_and_round_result_is_unchanged(tmp_path, ray_cluster, monkeypatch, caplog) -> None:
    # Prepare: the reference run, then a run whose first worker is killed while it trains.
    reference = run(RunConfig().override(_ray_overrides(tmp_path / "ref")))
    done = _inject_once(monkeypatch, lambda pool: ray.kill(pool.workers[0], no_restart=True) or "killed")
    # Execute
    with caplog.at_level("WARNING", logger="rayfed"):
        faulted = run(RunConfig().override(_ray_overrides(tmp_path / "faulted")))
    # Assert
    assert done == ["killed"]
    assert _Capture.sim.executor.pool.replacements >= 1
    assert "re-running them" in caplog.text
    assert faulted.accuracies == reference.accuracies
    assert [r["train_loss"] for r in faulted.history] == [r["train_loss"] for r in reference.history]


def test_hung_worker_times_out_and_is_replaced(tmp_path, ray_cluster, monkeypatch, caplog) -> None:
    reference = run(RunConfig().override(_ray_overrides(tmp_path / "ref")))

    def freeze(pool) -> str:
        _, pid = ray.get(pool.workers[0].node_and_pid.remote())
        os.kill(pid, signal.SIGSTOP)  # the worker hangs: alive, but never answers
        return "frozen"

    done = _inject_once(monkeypatch, freeze)
    overrides = _ray_overrides(tmp_path / "hung", **{"engine.round_timeout_s": 8.0})
    with caplog.at_level("WARNING", logger="rayfed"):
        hung = run(RunConfig().override(overrides))
    assert done == ["frozen"]
    assert "no answer within engine.round_timeout_s=8" in caplog.text
    assert hung.accuracies == reference.accuracies


def test_worker_that_always_dies_stops_the_run_after_max_retries_and_it_resumes(
    tmp_path, ray_cluster, monkeypatch
) -> None:
    # Prepare: from round 1 on, every worker is killed as soon as it is given the round's one batch.
    _Capture.sim = None
    run_dir = tmp_path / "run"
    overrides = _ray_overrides(
        run_dir, **{"engine.clients_per_call": 10, "engine.checkpoint_every": 1, "engine.max_retries": 2}
    )
    armed = [True]
    original_wait = ray.wait

    def kill_every_worker(refs, **kwargs):
        sim = _Capture.sim
        if armed[0] and sim is not None and sim.history:  # round 0 is done and checkpointed
            for worker in sim.executor.pool.workers:
                ray.kill(worker, no_restart=True)
        return original_wait(refs, **kwargs)

    monkeypatch.setattr(worker_pool.ray, "wait", kill_every_worker)
    # Execute
    with pytest.raises(WorkerError) as raised:
        run(RunConfig().override(overrides))
    # Assert: the error names the worker, the clients and the round, after max_retries replacements.
    message = str(raised.value)
    assert re.search(r"ClientWorker [01] failed \(ActorDiedError\) in round 1 ", message), message
    assert "clients [0, 1, 2, 3, 4, 5, 6, 7, ...] (10 clients)" in message and "engine.max_retries=2" in message
    assert message.endswith(f"continue from its checkpoint of round 0 with: rayfed run --resume {run_dir}")
    assert _Capture.sim.executor.pool.replacements == 2
    assert [r["round"] for r in pq.read_table(run_dir / "rounds.parquet").to_pylist()] == [0]
    armed[0] = False  # the cause is fixed: the run resumes from its round-0 checkpoint and ends
    assert main(["run", "--quiet", "--resume", str(run_dir)]) == 0
    assert [r["round"] for r in pq.read_table(run_dir / "rounds.parquet").to_pylist()] == [0, 1]


_METRICS = ("accuracy", "acc_mean", "test_loss", "train_loss", "server_bytes_received")


def _kill_server_while_round_1_trains(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Kill the ServerActor once, right after round 1's batches went to the workers; returns the killed pids."""
    killed: list[int] = []
    original_wait = ray.wait

    def wait_with_fault(refs, **kwargs):
        sim = _Capture.sim
        if not killed and sim is not None and len(sim.history) == 1:
            killed.append(ray.get(sim.executor.server.pid.remote()))
            ray.kill(sim.executor.server, no_restart=True)
        return original_wait(refs, **kwargs)

    monkeypatch.setattr(worker_pool.ray, "wait", wait_with_fault)
    return killed


def test_killed_server_is_restarted_and_the_run_ends_with_identical_metrics(
    tmp_path, ray_cluster, monkeypatch, caplog
) -> None:
    # Prepare: the reference run, then a run whose ServerActor is killed in round 1, after round 0 changed its state.
    _Capture.sim = None
    reference = run(RunConfig().override(_ray_overrides(tmp_path / "ref", **{"train.rounds": 3})))
    killed = _kill_server_while_round_1_trains(monkeypatch)
    # Execute
    with caplog.at_level("WARNING", logger="rayfed"):
        faulted = run(RunConfig().override(_ray_overrides(tmp_path / "faulted", **{"train.rounds": 3})))
    # Assert: one restart, and every round's numbers as if nothing had happened.
    assert len(killed) == 1 and _Capture.sim.executor.server_restarts == 1
    assert "ServerActor died (ActorDiedError) in round 1" in caplog.text
    assert faulted.rounds_run == 3
    for key in _METRICS:
        assert [r[key] for r in faulted.history] == [r[key] for r in reference.history], key


def test_server_that_always_dies_stops_the_run_after_max_retries_with_one_line(
    tmp_path, ray_cluster, monkeypatch, capsys
) -> None:
    # Prepare: the server is killed in round 1, and so is every ServerActor started after it.
    _Capture.sim = None
    run_dir = tmp_path / "run"
    killed = _kill_server_while_round_1_trains(monkeypatch)
    spawn = ray_executor.RayExecutor._spawn_server

    def spawn_dead(executor):
        server = spawn(executor)
        if killed:
            ray.kill(server, no_restart=True)
        return server

    monkeypatch.setattr(ray_executor.RayExecutor, "_spawn_server", spawn_dead)
    overrides = _ray_overrides(run_dir, **{"engine.max_retries": 1, "engine.checkpoint_every": 1})
    # Execute
    with pytest.raises(ServerError) as raised:
        run(RunConfig().override(overrides))
    # Assert: the error names the round, the bound and the resume command; round 0 and its checkpoint are kept.
    message = str(raised.value)
    assert "\n" not in message and "in round 1, 2 times" in message and "engine.max_retries=1" in message
    assert message.endswith(f"continue from its checkpoint of round 0 with: rayfed run --resume {run_dir}")
    assert _Capture.sim.executor.server_restarts == 1
    assert [r["round"] for r in pq.read_table(run_dir / "rounds.parquet").to_pylist()] == [0]
    assert (run_dir / "checkpoints" / "round_000000.npz").exists()


def test_driver_killed_mid_run_resumes_to_identical_metrics(tmp_path) -> None:
    # Prepare: an uninterrupted reference run of 5 rounds.
    overrides = tiny_overrides(tmp_path / "ref", **{"train.rounds": 5, "engine.checkpoint_every": 1})
    reference = run(RunConfig().override(overrides))
    run_dir = tmp_path / "killed"
    overrides = tiny_overrides(run_dir, **{"train.rounds": 5, "engine.checkpoint_every": 1})
    # Execute: the same run in a driver process SIGKILLed once round 1 is checkpointed, then resumed
    resumed = killed_and_resumed(run_dir, overrides)
    # Assert
    assert resumed.returncode == 0, resumed.stderr
    rows = pq.read_table(run_dir / "rounds.parquet").to_pylist()
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["accuracy"] for r in rows] == reference.accuracies
    assert [r["train_loss"] for r in rows] == [r["train_loss"] for r in reference.history]


def test_non_finite_updates_are_rejected_and_global_model_stays_finite(tmp_path) -> None:
    config = RunConfig().override(tiny_overrides(tmp_path / "run", **{"train.lr": 1e12, "engine.checkpoint_every": 1}))
    result = run(config)
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    rejected = [c for c in clients if c["rejected"]]
    assert rejected and all("non-finite" in c["rejected"] for c in rejected)
    assert sum(r["num_rejected"] for r in result.history) == len(rejected)
    state = load_arrays(sorted((tmp_path / "run" / "checkpoints").glob("*.npz"))[-1])
    assert np.isfinite(state["server/global"]).all()
    assert all(not math.isnan(a) for a in result.accuracies)


def test_updates_beyond_the_norm_bound_are_left_out(tmp_path) -> None:
    config = RunConfig().override(tiny_overrides(tmp_path / "run", **{"engine.max_update_norm": 1e-9}))
    result = run(config)
    assert all(r["num_rejected"] == r["num_sampled"] for r in result.history)
    # Nothing was aggregated, so the (initial) global model, and its accuracy, never change.
    assert result.accuracies[0] == result.accuracies[1]
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    assert all("exceeds engine.max_update_norm=1e-09" in c["rejected"] for c in clients)
