"""Asynchronous runs end to end: what rounds.parquet and the per-client files record is what the server applied
(a client launched twice from one version has each update applied at its own arrival, and counted each time, each
row with its own launch and arrival times), the timeline of who trained when is drawn, and FedBuff with every
client in the buffer on equal devices is synchronous FedAvg (Nguyen et al. 2022)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import rayfed
from rayfed import run
from rayfed.results.plots import write_figures
from rayfed.results.run_data import client_timeline
from rayfed.util.files import load_arrays
from tests.conftest import tiny_overrides

THREE = {"data.num_clients": 3, "data.partition": "iid", "train.rounds": 8}
"""3 clients of 225 training samples: 30 local steps each (batch 32, 1 epoch)."""


def _rows(run_dir: Path) -> list[dict]:
    return pq.read_table(run_dir / "rounds.parquet").to_pylist()


def _events(run_dir: Path, round_index: int) -> list[dict]:
    """The per-client rows of step ``round_index``'s arrivals and losses."""
    table = pq.read_table(run_dir / "clients" / f"round_{round_index:06d}.parquet").to_pylist()
    return [row for row in table if row["status"] is not None]


def _check_times(run_dir: Path) -> None:
    """Every arrival's row: launched no later than it arrived, arriving after the step before its own and by its
    own (the step's time is its last arrival's); a lost client's row: its launch, no arrival, and its loss, after its
    launch and the step before, by its step (an arrival's row has no loss)."""
    times = [0.0] + [row["virtual_time_s"] for row in _rows(run_dir)]
    for t in range(len(times) - 1):
        events = _events(run_dir, t)
        arrived = [row for row in events if row["status"] == "finished"]
        assert all(row["start_s"] <= row["finish_s"] and times[t] <= row["finish_s"] <= times[t + 1] for row in arrived)
        assert max(row["finish_s"] for row in arrived) == times[t + 1]
        lost = [row for row in events if row["status"] != "finished"]
        assert all(row["start_s"] <= times[t + 1] and row["finish_s"] is None for row in lost)
        assert all(max(row["start_s"], times[t]) <= row["lost_s"] <= times[t + 1] for row in lost)
        assert all(row["lost_s"] is None for row in arrived)


@pytest.mark.parametrize("buffer_size", [2, 3])
def test_a_client_launched_twice_from_one_version_is_applied_and_counted_at_each_arrival(
    tmp_path, buffer_size: int
) -> None:
    # Prepare: devices whose rounds take 1.82, 2.63 and 4.56 s (30 steps of 1/30 s times the slowdown, links free),
    # C = 3: client 0 reports first and is drawn again from version 0 (tests/algorithms/test_async_arrivals); with
    # K = 3 it arrives twice in the first step (at 1.82 and 3.64 s, client 1 at 2.63 s between)
    table = tmp_path / "devices.csv"
    rows = [f"{c},{s},1e12,1e12" for c, s in enumerate([1.82, 2.63, 4.56])]
    table.write_text("client_id,slowdown,download_mbps,upload_mbps\n" + "\n".join(rows) + "\n")
    overrides = {
        **THREE,
        "system.devices": "trace",
        "system.device_trace": str(table),
        "system.step_s": 1 / 30,
        "algorithm.name": "fedbuff",
        "algorithm.params": {"concurrency": 3, "buffer_size": buffer_size},
    }
    # Execute
    run(tiny_overrides(tmp_path / "run", **overrides))
    # Assert: every step applies K updates, as rounds.parquet says
    steps = _rows(tmp_path / "run")
    assert [r["server_clients_aggregated"] for r in steps] == [float(buffer_size)] * 8
    assert [r["clients_finished"] for r in steps] == [float(buffer_size)] * 8
    # participation counts every arrival, a client's two in one step included
    participation = pq.read_table(tmp_path / "run" / "participation.parquet").to_pydict()
    assert sum(participation["finished"]) == 8 * buffer_size
    first = pq.read_table(tmp_path / "run" / "clients" / "round_000000.parquet").to_pylist()
    arrived = [(c["client_id"], c["staleness"]) for c in first if c["status"] == "finished"]
    if buffer_size == 2:  # the staleness of what the server applied: the schedule's (test_async_arrivals)
        assert [r["staleness_mean"] for r in steps] == [0.0, 1.0, 1.0, 0.5, 1.5, 1.0, 0.5, 1.5]
        assert steps[0]["clients_launched"] == 4.0 and arrived == [(0, 0.0), (1, 0.0)]
    else:
        assert arrived == [(0, 0.0), (0, 0.0), (1, 0.0)]
    # each row's launch and arrival times: its own launch's (client 0's two from version 0 at 0 and 1.82 s)
    _check_times(tmp_path / "run")
    times = [(c["client_id"], c["start_s"], c["finish_s"]) for c in first if c["status"] == "finished"]
    one, two, three = (pytest.approx(s) for s in (1.82, 3.64, 2.63))
    assert times == (
        [(0, 0.0, one), (1, 0.0, three)] if buffer_size == 2 else [(0, 0.0, one), (0, one, two), (1, 0.0, three)]
    )


def test_a_fedasync_run_records_each_launch_and_arrival_and_draws_its_timeline(tmp_path) -> None:
    # Prepare: FedAsync (K = 1) on drawn devices, some clients dropping out
    overrides = {
        **THREE,
        "data.num_clients": 6,
        "system.devices": "lognormal",
        "system.dropout": 0.3,
        "algorithm.name": "fedasync",
        "algorithm.params": {"concurrency": 3},
    }
    # Execute
    run(tiny_overrides(tmp_path / "run", **overrides))
    timeline = client_timeline(rayfed.load_run(tmp_path / "run"))
    paths, _ = write_figures([tmp_path / "run"], tmp_path / "figures")
    # Assert: each step applies one update, arrived at the step's virtual time, launched before it
    _check_times(tmp_path / "run")
    steps = _rows(tmp_path / "run")
    for t, step in enumerate(steps):
        arrived = [row for row in _events(tmp_path / "run", t) if row["status"] == "finished"]
        assert [row["finish_s"] for row in arrived] == [step["virtual_time_s"]]
    assert sum(step["clients_dropped"] + step["clients_offline"] for step in steps) > 0  # lost rows were checked
    # the timeline: a line per arrival or loss, from its launch to its arrival (a lost one's: to its loss)
    events = [row for t in range(len(steps)) for row in _events(tmp_path / "run", t)]
    assert len(timeline["client_id"]) == len(events)
    ends = [row["finish_s"] if row["status"] == "finished" else row["lost_s"] for row in events]
    assert sorted(timeline["end_s"].tolist()) == sorted(ends)
    assert (timeline["start_s"] <= timeline["end_s"]).all() and set(timeline["status"]) >= {"finished", "dropped"}
    assert tmp_path / "figures" / "run-timeline.png" in paths


def test_fedbuff_with_every_client_in_the_buffer_on_equal_devices_is_synchronous_fedavg(tmp_path) -> None:
    # Prepare: C = K = M = 4 clients of equal size on equal devices, server learning rate 1
    common = {**THREE, "data.num_clients": 4, "system.devices": "equal", "train.rounds": 4}
    fedbuff = {"algorithm.name": "fedbuff", "algorithm.params": {"concurrency": 4, "buffer_size": 4, "server_lr": 1.0}}
    # Execute
    run(tiny_overrides(tmp_path / "fedbuff", **common, **fedbuff))
    run(tiny_overrides(tmp_path / "fedavg", **common, **{"algorithm.name": "fedavg"}))
    # Assert: every step applies the 4 updates of the version before it (staleness 0), and the model of every round
    # is FedAvg's to float rounding (x − Σ (x − x_k) / K against the size-weighted mean of equal sizes)
    steps, rounds = _rows(tmp_path / "fedbuff"), _rows(tmp_path / "fedavg")
    assert [r["staleness_max"] for r in steps] == [0.0] * 4 and [r["clients_launched"] for r in steps] == [4.0] * 4
    # the same schedule: the clock charges each method's own upload (docs/system.md, Eq. 1), and FedBuff's upload
    # records a few bytes more than FedAvg's (bytes_up), microseconds of virtual time a round
    np.testing.assert_allclose([r["virtual_time_s"] for r in steps], [r["virtual_time_s"] for r in rounds], rtol=1e-5)
    for column in ("train_loss", "accuracy"):
        np.testing.assert_allclose([r[column] for r in steps], [r[column] for r in rounds], rtol=1e-4)
    last = [load_arrays(sorted((tmp_path / kind / "checkpoints").glob("*.npz"))[-1]) for kind in ("fedbuff", "fedavg")]
    # float rounding of the two sums over four steps: up to 1.6e-5 on an AMD EPYC, under 1e-5 on an Intel Xeon
    np.testing.assert_allclose(last[0]["server/global"], last[1]["server/global"], atol=5e-5)
