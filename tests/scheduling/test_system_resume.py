"""A run with a system model gives the same bits on Ray with two workers as in-process, and after its driver is
SIGKILLed mid-run and the run resumed: synchronous rounds with a deadline, FedBuff, and a method whose work
changes by round (its rounds timed from their own messages and its clients' states)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import run
from rayfed.util.files import load_arrays
from tests.conftest import tiny_overrides
from tests.killed_driver import killed_and_resumed

CASES = {
    "sync": {
        "system.devices": "lognormal",
        "system.step_s": 0.05,
        "system.deadline_s": 6.0,
        "system.late_work": "partial",
        "engine.join_ratio": 0.5,
        "system.over_commit": 1.5,
        "system.dropout": 0.1,
    },
    "fedbuff": {
        "system.devices": "lognormal",
        "system.step_s": 0.05,
        "algorithm.name": "fedbuff",
        "algorithm.params": {"concurrency": 6, "buffer_size": 3, "server_lr": 0.8},
    },
    "varying": {  # each round's own work, found from its message and the clients' states (FedFomo's downloads)
        "system.devices": "lognormal",
        "system.step_s": 0.05,
        "engine.join_ratio": 0.5,
        "algorithm.name": "fedfomo",
        "algorithm.params": {"num_models": 2},
    },
}


def _records(run_dir: Path) -> tuple[list[dict], list[list[dict]], dict[str, np.ndarray]]:
    """Every round's row but its timings and the bytes the server received (fewer where a node adds its workers'
    uploads up first), every per-client file but its timings, and the last checkpoint's server state and system
    arrays."""
    rows = [
        {
            k: v
            for k, v in row.items()
            if k != "server_bytes_received" and (not k.endswith("_s") or k == "virtual_time_s")
        }
        for row in pq.read_table(run_dir / "rounds.parquet").to_pylist()
    ]
    clients = [
        [{k: v for k, v in row.items() if k != "train_s"} for row in pq.read_table(path).to_pylist()]
        for path in sorted((run_dir / "clients").glob("round_*.parquet"))
    ]
    last = load_arrays(sorted((run_dir / "checkpoints").glob("*.npz"))[-1])
    return rows, clients, {k: v for k, v in last.items() if k.startswith(("server/", "system/"))}


def _plain(rows: list[dict]) -> list[dict]:
    """``rows`` with NaN as None, so that equal records compare equal (NaN is unequal to itself)."""
    return [{k: None if isinstance(v, float) and np.isnan(v) else v for k, v in row.items()} for row in rows]


def _same(a: tuple, b: tuple) -> None:
    assert _plain(a[0]) == _plain(b[0])
    assert [_plain(rows) for rows in a[1]] == [_plain(rows) for rows in b[1]]
    assert a[2].keys() == b[2].keys() and all(np.array_equal(a[2][k], b[2][k]) for k in a[2])


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ray_workers_give_the_bits_of_a_local_run(tmp_path, ray_cluster, case) -> None:
    # The same calls (engine.clients_per_call) on either backend: the same summation tree, and so the same bits
    overrides = {**CASES[case], "train.rounds": 3, "engine.clients_per_call": 2}
    run(tiny_overrides(tmp_path / "local", **overrides))
    run(tiny_overrides(tmp_path / "ray", **{**overrides, "engine.backend": "ray", "engine.num_workers": 2}))
    _same(_records(tmp_path / "ray"), _records(tmp_path / "local"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_driver_killed_mid_run_resumes_to_the_bits_of_an_uninterrupted_run(tmp_path, case) -> None:
    # Prepare: the uninterrupted run
    overrides = {**CASES[case], "train.rounds": 5, "engine.checkpoint_every": 1}
    run(tiny_overrides(tmp_path / "ref", **overrides))
    run_dir = tmp_path / "killed"
    # Execute: the same run in a driver SIGKILLed once round 1 is checkpointed, then resumed
    resumed = killed_and_resumed(run_dir, tiny_overrides(run_dir, **overrides))
    # Assert
    assert resumed.returncode == 0, resumed.stderr
    _same(_records(run_dir), _records(tmp_path / "ref"))
