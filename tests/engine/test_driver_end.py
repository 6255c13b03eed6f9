"""The driver's end, as a user or a batch scheduler ends it: SIGTERM stops a run as Ctrl-C does (one line, the
resume command, exit status 143), and a driver killed outright leaves no process of its private Ray behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from rayfed.util.processes import children, process_start_time
from tests.conftest import tiny_overrides
from tests.waiting import wait_for_file, wait_until

REPO = Path(__file__).resolve().parents[2]
_GONE_WITHIN_S = 30


def _start_driver(run_dir: Path) -> subprocess.Popen[str]:
    """``rayfed run`` of many rounds on a private Ray of one worker, in its own process."""
    overrides = tiny_overrides(
        run_dir,
        **{
            "data.options": {"num_samples": 1000},
            "train.batch_size": 25,
            "train.rounds": 50,
            "engine.backend": "ray",
            "engine.num_workers": 1,
            "engine.checkpoint_every": 0,
        },
    )
    args = [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items()]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.Popen(
        [sys.executable, "-m", "rayfed", "run", "--quiet", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _descendants_once_training(driver: subprocess.Popen[str], run_dir: Path) -> dict[int, str]:
    """Every process the driver started (pid: start time), once its first round is recorded."""
    wait_for_file(run_dir / "rounds.parquet", driver, "the driver's first round")
    found: dict[int, str] = {}
    frontier = frozenset({driver.pid})
    while frontier:
        new = {pid: start for pid, start in children(frontier).items() if pid not in found}
        found.update(new)
        frontier = frozenset(new)
    return found


def _all_gone(processes: dict[int, str]) -> None:
    """Return once none of ``processes`` runs (a pid reused by a later process has another start time)."""

    def gone() -> bool:
        return all(process_start_time(pid) != start for pid, start in processes.items())

    wait_until(gone, f"the end of the driver's processes {sorted(processes)}", limit_s=_GONE_WITHIN_S, every_s=0.5)


def test_sigterm_stops_a_run_like_ctrl_c_with_one_line_and_status_143(tmp_path) -> None:
    run_dir = tmp_path / "run"
    driver = _start_driver(run_dir)
    started = _descendants_once_training(driver, run_dir)
    driver.send_signal(signal.SIGTERM)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 143, err
    assert "Traceback" not in err
    line = out.strip().splitlines()[-1]
    assert line.startswith("terminated (SIGTERM): ") and "rounds done, checkpoint of round" in line
    assert line.endswith(f"continue with: rayfed run --resume {run_dir}")
    assert any((run_dir / "checkpoints").glob("round_*.npz"))
    _all_gone(started)


def test_a_killed_driver_leaves_no_process_of_its_private_ray_behind(tmp_path) -> None:
    run_dir = tmp_path / "run"
    driver = _start_driver(run_dir)
    started = _descendants_once_training(driver, run_dir)
    assert len(started) >= 4  # the GCS, the raylet, the agents, the workers, the watchdog
    driver.kill()
    driver.communicate()
    _all_gone(started)
