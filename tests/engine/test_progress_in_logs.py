"""Progress in a log (stderr not a terminal: a file, ``ray job logs``): one line per round, no bar's redraws."""

from __future__ import annotations

from pathlib import Path

import pytest
from tqdm.auto import tqdm

from rayfed import RunConfig, run
from rayfed.util import progress
from rayfed.util.progress import StepLines, steps
from tests.conftest import tiny_overrides


def test_a_run_logs_one_line_per_round_and_no_batch_bars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = RunConfig().override(tiny_overrides(tmp_path / "run", **{"engine.progress": True, "train.rounds": 3}))

    run(config)

    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("run: ")]
    assert [line.split(" (")[0] for line in lines] == ["run: 1/3 round", "run: 2/3 round", "run: 3/3 round"]
    assert all("acc=" in line and "loss=" in line for line in lines)
    assert "\r" not in err and "batch" not in err and len(err) < 2000


def test_on_a_terminal_progress_is_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    with steps(3, "run", "round") as bar:
        assert isinstance(bar, tqdm)
    monkeypatch.setattr(progress, "on_terminal", lambda: False)
    with steps(3, "run", "round") as bar:
        assert isinstance(bar, StepLines)


def test_a_bar_scales_only_totals_of_thousands(monkeypatch: pytest.MonkeyPatch) -> None:
    """``3/8 batch``, but ``12.0k/70.0k sample``."""
    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    assert [progress.progress_bar(n, "step", "unit").unit_scale for n in (8, 70_000)] == [False, True]
