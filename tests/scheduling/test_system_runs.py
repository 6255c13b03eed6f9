"""Runs with a system model (docs/system.md): the numbers of a run without one on equal devices, virtual time and
each client's fate recorded, partial work trained to its steps, FedBuff's and FedAsync's steps, traces read through
the config, step_s calibrated, and bad input refused in one line before anything is written."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import RunConfig, run
from rayfed.engine import Simulation
from rayfed.scheduling.sync_rounds import VirtualRounds
from rayfed.util.errors import ConfigError
from rayfed.util.files import load_arrays
from tests.conftest import tiny_overrides

LOGNORMAL = {"system.devices": "lognormal", "system.step_s": 0.05}
DEADLINE = {**LOGNORMAL, "system.deadline_s": 8.0, "engine.join_ratio": 0.5, "system.over_commit": 1.5}
FEDBUFF = {**LOGNORMAL, "algorithm.name": "fedbuff", "algorithm.params": {"concurrency": 6, "buffer_size": 3}}


def _rows(run_dir: Path) -> list[dict]:
    return pq.read_table(run_dir / "rounds.parquet").to_pylist()


def _clients(run_dir: Path, round_index: int) -> list[dict]:
    return pq.read_table(run_dir / "clients" / f"round_{round_index:06d}.parquet").to_pylist()


def _server(run_dir: Path) -> dict[str, np.ndarray]:
    return load_arrays(sorted((run_dir / "checkpoints").glob("*.npz"))[-1])


def test_equal_devices_always_online_without_a_deadline_give_the_numbers_of_a_run_without_them(tmp_path) -> None:
    # Execute
    plain = run(tiny_overrides(tmp_path / "plain", **{"train.rounds": 3, "engine.join_ratio": 0.5}))
    equal = run(
        tiny_overrides(tmp_path / "equal", **{"train.rounds": 3, "engine.join_ratio": 0.5, "system.devices": "equal"})
    )
    # Assert: round for round, the same clients, accuracies, losses and final model, and virtual time beside them
    assert equal.accuracies == plain.accuracies
    assert [r["train_loss"] for r in equal.history] == [r["train_loss"] for r in plain.history]
    assert np.array_equal(_server(tmp_path / "equal")["server/global"], _server(tmp_path / "plain")["server/global"])
    assert "virtual_time_s" not in plain.history[0]
    assert [r["clients_finished"] for r in equal.history] == [5.0, 5.0, 5.0]


def test_a_deadline_on_lognormal_devices_records_virtual_time_and_late_clients(tmp_path) -> None:
    # Execute
    result = run(tiny_overrides(tmp_path / "run", **{**DEADLINE, "train.rounds": 4, "system.target_accuracy": 0.05}))
    # Assert: virtual time grows; some clients late, their work not trained; every sampled client has a status
    rows = _rows(tmp_path / "run")
    times = [r["virtual_time_s"] for r in rows]
    assert all(b > a for a, b in zip([0.0, *times], times))
    assert sum(r["clients_late"] for r in rows) > 0
    assert all(r["num_sampled"] == r["clients_finished"] == 5 for r in rows)  # over-commitment kept the first 5
    statuses = {}
    for t in range(4):
        for client in _clients(tmp_path / "run", t):
            statuses[client["status"]] = statuses.get(client["status"], 0) + 1
            assert (client["steps"] is not None) == (client["status"] == "finished")
            assert (client["finish_s"] is not None) == (client["status"] in ("finished", "late", "surplus"))
    assert (
        statuses[None] > 0 and statuses["finished"] == 20 and statuses["late"] == sum(r["clients_late"] for r in rows)
    )
    participation = pq.read_table(tmp_path / "run" / "participation.parquet").to_pylist()
    assert len(participation) == 10 and sum(p["sampled"] for p in participation) == 4 * 7
    assert sum(p["late"] for p in participation) == statuses["late"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["virtual_time_s"] == times[-1]
    assert summary["rounds_to_target"] == 1 and summary["virtual_time_to_target_s"] == times[0]
    assert result.rounds_run == 4


def test_partial_work_trains_the_steps_done_by_the_deadline(tmp_path) -> None:
    # Prepare: a deadline few clients meet, so that the late ones' partial work counts
    overrides = {**LOGNORMAL, "system.deadline_s": 4.0, "system.late_work": "partial", "train.rounds": 3}
    config = RunConfig().override(tiny_overrides(tmp_path / "run", **overrides))
    sim = Simulation(config)
    assert isinstance(sim.rounds, VirtualRounds)
    rounds, work = sim.rounds.rounds, sim.rounds.rounds.work
    # Execute
    sim.run()
    # Assert: every partial client took exactly the steps it did by the deadline, fewer than its round's
    rows, start, partial = _rows(tmp_path / "run"), 0.0, 0
    for t, row in enumerate(rows):
        outcome = rounds.round(t, start)
        trained = {c["client_id"]: c for c in _clients(tmp_path / "run", t) if c["status"] in ("finished", "partial")}
        for cid, status, steps in zip(outcome.client_ids, outcome.status, outcome.steps):
            if status == 1:
                partial += 1
                assert trained[int(cid)]["status"] == "partial"
                assert 0 < trained[int(cid)]["steps"] == steps < work.steps[cid]
        start = row["virtual_time_s"]
        assert start == outcome.end_s
    assert partial > 0


def test_fedbuff_steps_apply_k_updates_with_their_staleness(tmp_path) -> None:
    # Execute
    result = run(tiny_overrides(tmp_path / "run", **{**FEDBUFF, "train.rounds": 5}))
    # Assert: every server step applies K = 3 updates, some stale, in increasing virtual time
    rows = _rows(tmp_path / "run")
    assert [r["server_clients_aggregated"] for r in rows] == [3.0] * 5
    assert [r["clients_finished"] for r in rows] == [3.0] * 5
    assert rows[0]["clients_launched"] == 8  # the 6 slots filled, then 2 launched as the first 2 updates arrived
    assert rows[0]["staleness_max"] == 0 and max(r["staleness_max"] for r in rows) > 0
    times = [r["virtual_time_s"] for r in rows]
    assert all(b > a for a, b in zip(times, times[1:]))
    arrived = [c for t in range(5) for c in _clients(tmp_path / "run", t) if c["status"] == "finished"]
    assert len(arrived) == 15 and all(c["staleness"] >= 0 for c in arrived)
    assert all(0 <= a <= 1 for a in result.accuracies)


def test_fedasync_makes_a_version_per_update(tmp_path) -> None:
    overrides = {**FEDBUFF, "algorithm.name": "fedasync", "algorithm.params": {"concurrency": 4}, "train.rounds": 4}
    run(tiny_overrides(tmp_path / "run", **overrides))
    rows = _rows(tmp_path / "run")
    assert [r["clients_finished"] for r in rows] == [1.0] * 4
    assert all(0 < r["server_fedasync_alpha"] <= 0.6 for r in rows)


def _pickle(path: Path, data: object) -> str:
    path.write_bytes(pickle.dumps(data))
    return str(path)


def test_fedscale_traces_run_through_the_config(tmp_path) -> None:
    # Prepare: FedScale's capacity and behaviour files, 10 clients online a half of every 100 s, client k from 5k s
    capacity = {k: {"computation": 5.0 * k, "communication": 2000.0 * k} for k in range(1, 11)}
    behaviour = {
        k: {"active": [5 * k], "inactive": [5 * k + 50], "finish_time": 100, "duration": 100} for k in range(10)
    }
    overrides = {
        "system.devices": "trace",
        "system.device_trace": _pickle(tmp_path / "client_device_capacity", capacity),
        "system.availability": "trace",
        "system.availability_trace": _pickle(tmp_path / "client_behave_trace", behaviour),
        "engine.join_ratio": 0.3,
    }
    # Execute
    run(tiny_overrides(tmp_path / "run", **overrides))
    # Assert: only clients online at a round's start are sampled: client 0 alone at 0 s, 3 of clients 0-3 later
    rows = _rows(tmp_path / "run")
    sampled = [[c["client_id"] for c in _clients(tmp_path / "run", t) if c["status"]] for t in range(2)]
    assert sampled[0] == [0] and len(sampled[1]) == 3 and set(sampled[1]) <= {0, 1, 2, 3}
    assert 15 < rows[0]["virtual_time_s"] < 20 < rows[1]["virtual_time_s"]


def test_calibrate_measures_step_s_once_and_a_resume_keeps_it(tmp_path) -> None:
    overrides = tiny_overrides(tmp_path / "run", **{**LOGNORMAL, "system.calibrate": True, "train.rounds": 1})
    run(overrides)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["system"]
    assert saved["calibrate"] and saved["step_s"] != 0.05 and saved["step_s"] > 0
    run({**overrides, "train.rounds": 2}, resume=True)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["system"]["step_s"] == saved["step_s"]


def _trace_table(path: Path, rows: list[str]) -> str:
    path.write_text("client_id,slowdown,download_mbps,upload_mbps\n" + "\n".join(rows) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        pytest.param(
            {"system.devices": "trace", "system.device_trace": "{dir}/eight.csv"},
            ["eight.csv", "2 of the run's 10 clients (client_id 8, 9)"],
            id="a trace missing clients",
        ),
        pytest.param(
            {"system.devices": "trace", "system.device_trace": "{dir}/negative.csv"},
            ["client 3", "slowdown", "-2"],
            id="a negative speed",
        ),
        pytest.param(
            {**LOGNORMAL, "system.deadline_s": 0.001}, ["system.deadline_s=0.001", "fastest"], id="a deadline"
        ),
        pytest.param(
            {**FEDBUFF, "algorithm.params": {"concurrency": 3, "buffer_size": 5}},
            ["algorithm.params.buffer_size=5", "algorithm.params.concurrency=3"],
            id="a buffer beyond the concurrency",
        ),
        pytest.param(
            {**FEDBUFF, "algorithm.params": {"concurrency": 20}}, ["concurrency=20", "[1, 10]"], id="concurrency"
        ),
        pytest.param({"algorithm.name": "fedbuff"}, ["system.devices='off'"], id="fedbuff without devices"),
        pytest.param({**FEDBUFF, "engine.join_ratio": 0.5}, ["engine.join_ratio=0.5"], id="fedbuff sampling"),
    ],
)
def test_bad_system_input_is_refused_in_one_line_before_anything_is_written(tmp_path, overrides, fragments) -> None:
    # Prepare
    _trace_table(tmp_path / "eight.csv", [f"{i},1,10,5" for i in range(8)])
    _trace_table(tmp_path / "negative.csv", [f"{i},{-2 if i == 3 else 1},10,5" for i in range(10)])
    resolved = {k: v.format(dir=tmp_path) if isinstance(v, str) else v for k, v in overrides.items()}
    # Execute
    with pytest.raises(ConfigError) as refused:
        run(tiny_overrides(tmp_path / "run", **resolved))
    # Assert
    message = str(refused.value)
    assert "\n" not in message and all(fragment in message for fragment in fragments), message
    assert not (tmp_path / "run").exists()
