"""What a run shows of its system (docs/system.md, "What a run records"): the devices it drew, as trace tables that
another run reads back; the clients online at each sampling; who trained when; virtual time in the closing line."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

import rayfed
from rayfed import RunConfig, run
from rayfed.cli import _virtual_time
from rayfed.engine import Simulation
from rayfed.results.plots import write_figures
from rayfed.results.run_data import client_timeline
from rayfed.scheduling.sync_rounds import VirtualRounds
from tests.conftest import tiny_overrides

DIURNAL = {
    "system.devices": "lognormal",
    "system.step_s": 0.05,
    "system.availability": "diurnal",
    "system.deadline_s": 8.0,
    "engine.join_ratio": 0.3,
    "system.over_commit": 1.5,
    "system.target_accuracy": 0.05,
    "train.rounds": 3,
}


@pytest.fixture(scope="module")
def diurnal_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("diurnal") / "run"
    sim = Simulation(RunConfig().override(tiny_overrides(run_dir, **DIURNAL)))
    assert isinstance(sim.rounds, VirtualRounds)
    return sim.run(), sim.rounds.rounds


def test_the_drawn_devices_are_tables_another_run_reads_back_as_its_traces(diurnal_run, tmp_path) -> None:
    # Prepare
    result, rounds = diurnal_run
    saved = rayfed.load_run(result.run_dir)
    # Assert: the run directory's tables hold the devices the run drew
    assert saved.devices["client_id"].tolist() == list(range(10))
    assert np.allclose(saved.devices["slowdown"], rounds.devices.slowdown, rtol=0, atol=0)
    assert len(saved.availability["client_id"]) == len(rounds.devices.availability.starts)
    # Execute: a run given them as its traces
    traced = {
        **DIURNAL,
        "system.devices": "trace",
        "system.device_trace": str(result.run_dir / "devices.parquet"),
        "system.availability": "trace",
        "system.availability_trace": str(result.run_dir / "availability.parquet"),
    }
    again = Simulation(RunConfig().override(tiny_overrides(tmp_path / "again", **traced)))
    assert isinstance(again.rounds, VirtualRounds)
    # Assert: the same rounds, client for client
    for t in range(3):
        first, second = rounds.round(t, 100.0 * t), again.rounds.rounds.round(t, 100.0 * t)
        assert first.client_ids.tolist() == second.client_ids.tolist()
        assert np.allclose(first.finish_s, second.finish_s) and first.status.tolist() == second.status.tolist()


def test_each_round_records_the_clients_online_when_it_sampled(diurnal_run) -> None:
    result, rounds = diurnal_run
    starts = [0.0] + [row["virtual_time_s"] for row in result.history[:-1]]
    everyone = np.arange(10)
    for row, start in zip(result.history, starts):
        began = rounds.round(row["round"], start).start_s
        assert row["clients_online"] == rounds.devices.availability.online(everyone, began).sum()
    assert min(row["clients_online"] for row in result.history) < 10  # the diurnal windows leave some offline


def test_the_timeline_says_who_trained_when_and_is_drawn(diurnal_run, tmp_path) -> None:
    # Execute
    result, _ = diurnal_run
    timeline = client_timeline(rayfed.load_run(result.run_dir))
    paths, _ = write_figures([result.run_dir], tmp_path / "figures")
    # Assert: one line per sampled client and round, within its round
    sampled = sum(
        pq.read_table(result.run_dir / "clients" / f"round_{t:06d}.parquet")["status"].is_valid().to_numpy().sum()
        for t in range(3)
    )
    assert len(timeline["client_id"]) == sampled
    ends = np.array([row["virtual_time_s"] for row in result.history])[timeline["round"]]
    assert (timeline["start_s"] <= timeline["end_s"]).all() and (timeline["end_s"] <= ends).all()
    assert tmp_path / "figures" / "run-timeline.png" in paths


def test_the_closing_line_says_the_virtual_time_and_the_time_to_target(diurnal_run, tmp_path) -> None:
    result, _ = diurnal_run
    note = _virtual_time(result)
    assert note.startswith(f", virtual time {result.history[-1]['virtual_time_s']:.1f} s (accuracy 0.05 at ")
    plain = run(tiny_overrides(tmp_path / "plain", **{"train.rounds": 1}))
    assert _virtual_time(plain) == ""
