"""A run whose driver is SIGKILLed mid-run, then resumed: what the resume tests share.

The run is started as ``rayfed run`` in a process of its own, killed (SIGKILL: no handler runs, nothing is tidied)
once its checkpoint of round 1 is on disk, and continued with ``rayfed run --resume``; the caller compares the
run directory with an uninterrupted run's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.waiting import wait_for_file

__all__ = ["killed_and_resumed"]

REPO = Path(__file__).resolve().parents[1]


def killed_and_resumed(run_dir: Path, overrides: Mapping[str, object]) -> subprocess.CompletedProcess[str]:
    """Run ``overrides`` (with ``run_dir`` their run directory) in a driver SIGKILLed once round 1 is checkpointed,
    then resume it to its end; the resumed process (its status and stderr). Fails if the driver ended first."""
    args = [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items()]
    driver = subprocess.Popen(
        [sys.executable, "-m", "rayfed", "run", "--quiet", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_for_file(run_dir / "checkpoints" / "round_000001.npz", driver, "the driver's checkpoint of round 1")
    driver.kill()
    driver.wait()
    assert not (run_dir / "summary.json").exists()  # it really died before the end
    return subprocess.run(
        [sys.executable, "-m", "rayfed", "run", "--quiet", "--resume", str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
