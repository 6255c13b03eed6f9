"""Packs of tiny runs for the tests of ``rayfed.run_many`` (tests/packs), and the check that a packed run gives the
rounds it gives alone: shared by the local backend's tests and Ray's."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from rayfed.config import RunConfig
from tests.conftest import tiny_overrides
from tests.waiting import wait_for_file

LOSS_RTOL, ACCURACY_ATOL = 1e-3, 0.02
"""The stacked path's run-level agreement (tests/train/test_stacked.py): a stack that holds other runs' clients is a
stack of another width, which sums its grouped products in another order, and training carries the last bits'
difference on from round to round (benchmarks/packed_runs.py, RUNS_TOLERANCE)."""
HYPER = {"fedprox": "algorithm.params.mu", "cwfedavg": "algorithm.params.wdr_lambda", "ditto": "algorithm.params.lam"}
"""What each method's loss reads that the runs of a pack differ in."""


def run_overrides(
    run_dir: Path, method: str, seed: int, lr: float, value: float | None, **extra: Any
) -> dict[str, Any]:
    overrides = tiny_overrides(
        run_dir,
        seed=seed,
        **{
            "algorithm.name": method,
            "train.lr": lr,
            "engine.vectorize": "on",
            "data.num_clients": 8,
            "data.partition": "dirichlet",
            "data.alpha": 0.3,
            "engine.clients_per_call": 4,
        },
    )
    if value is not None:
        overrides[HYPER[method]] = value
    overrides.update(extra)
    return overrides


def run_config(run_dir: Path, method: str, seed: int, lr: float, value: float | None = None, **extra: Any) -> RunConfig:
    return RunConfig().override(run_overrides(run_dir, method, seed, lr, value, **extra))


def pack_overrides(tmp_path: Path, method: str, **extra: Any) -> list[dict[str, Any]]:
    values = (0.01, 0.1, 0.5) if method in HYPER else (None, None, None)
    return [
        run_overrides(tmp_path / f"{method}-{i}", method, seed, lr, value, **extra)
        for i, (seed, lr, value) in enumerate(zip((0, 1, 2), (0.01, 0.03, 0.01), values))
    ]


def pack_configs(tmp_path: Path, method: str, **extra: Any) -> list[RunConfig]:
    return [RunConfig().override(o) for o in pack_overrides(tmp_path, method, **extra)]


def alone_config(config: RunConfig) -> RunConfig:
    return config.override({"run_dir": f"{config.run_dir}-alone"})


def rounds_of(run_dir: Path) -> list[dict[str, Any]]:
    return pq.read_table(Path(run_dir) / "rounds.parquet").to_pylist()


def assert_same_numbers(packed: Path, alone: Path) -> None:
    one, other = rounds_of(packed), rounds_of(alone)
    assert len(one) == len(other)
    keys = [k for k in one[0] if ("loss" in k or "acc" in k) and isinstance(one[0][k], float)]
    assert "train_loss" in keys and "accuracy" in keys
    for a, b in zip(one, other):
        for key in keys:
            both_nan = math.isnan(a[key]) and math.isnan(b[key])
            tolerance = {"abs_tol": ACCURACY_ATOL} if "acc" in key else {"rel_tol": LOSS_RTOL}
            assert both_nan or math.isclose(a[key], b[key], **tolerance), (a["round"], key, a[key], b[key])


_DRIVER = """
import json, sys
import rayfed
configs = [rayfed.RunConfig().override(c) for c in json.loads(sys.argv[1])]
rayfed.run_many(configs)
"""
REPO = Path(__file__).resolve().parents[2]


def driver_past_round_0(overrides: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
    """A driver process running ``rayfed.run_many`` of ``overrides``' configs (on Ray, a private Ray that ends with
    it), returned once the first run has checkpointed round 0: what a test then stops."""
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, json.dumps(overrides, default=str)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    first = RunConfig().override(overrides[0])
    wait_for_file(Path(first.run_dir) / "checkpoints" / "round_000000.npz", driver, "the pack's checkpoint of round 0")
    return driver
