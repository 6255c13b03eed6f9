"""``rayfed tune`` with trials at once: their runs share one stack where they may (issue 64), the log says so in
one line, each trial is still pruned on its own, and the best trial's numbers are those of its run alone; a
``rayfed tune --parallel 4`` stopped by Ctrl-C resumes with the same command, retrying each interrupted trial once,
to the trials it was asked for."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pyarrow.parquet as pq
import pytest
from optuna.trial import TrialState

import rayfed.tuning.attrs as attrs
from rayfed import RunConfig, run
from rayfed.cli import main
from rayfed.execution.stack_merger import StackMerger
from rayfed.tuning import finished_trials, tune
from rayfed.tuning.space import SearchSpace
from rayfed.tuning.trials import TrialRunner, packed
from tests.conftest import tiny_overrides
from tests.tuning.test_tuning import _interrupted_trials_stopped_after_a_round
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

SPACE = {
    "train.lr": {"type": "float", "low": 0.005, "high": 0.05, "log": True},
    "algorithm.params.wdr_lambda": {"type": "float", "low": 0.01, "high": 1.0, "log": True},
}
LOSS_RTOL, ACCURACY_ATOL = 1e-3, 0.02
"""The stacked path's run-level agreement, as tests/packs/test_run_many.py holds packed runs to."""
REPO = Path(__file__).resolve().parents[2]


def _base(tmp_path: Path, **extra: Any) -> RunConfig:
    overrides = tiny_overrides(
        tmp_path / "base",
        **{
            "algorithm.name": "cwfedavg",
            "engine.vectorize": "on",
            "data.num_clients": 8,
            "data.partition": "dirichlet",
            "data.alpha": 0.3,
            "train.rounds": 3,
            "engine.clients_per_call": 4,
            **extra,
        },
    )
    return RunConfig().override(overrides)


@pytest.fixture
def mergers(monkeypatch: pytest.MonkeyPatch) -> list[StackMerger]:
    """The mergers the studies' trials share their stacks in, as tune makes them."""
    made: list[StackMerger] = []

    class Counted(StackMerger):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr("rayfed.tuning.trials.StackMerger", Counted)
    return made


def _assert_equals_its_run_alone(trial: optuna.trial.FrozenTrial, base: RunConfig, run_dir: Path) -> None:
    """``trial``'s rounds are those of its parameters run alone in ``run_dir`` (within the stacked path's
    run-level agreement: a merged stack is one of another width)."""
    run(base.override({**trial.params, "run_dir": str(run_dir)}))
    packed_rows = pq.read_table(Path(trial.user_attrs[attrs.RUN_DIR]) / "rounds.parquet").to_pylist()
    alone_rows = pq.read_table(run_dir / "rounds.parquet").to_pylist()
    assert len(packed_rows) == len(alone_rows) == base.train.rounds
    for mine, theirs in zip(packed_rows, alone_rows):
        assert mine["train_loss"] == pytest.approx(theirs["train_loss"], rel=LOSS_RTOL, nan_ok=True)
        assert mine["accuracy"] == pytest.approx(theirs["accuracy"], abs=ACCURACY_ATOL)


def test_parallel_trials_share_one_stack_prune_alone_and_equal_their_runs_alone(
    tmp_path: Path, caplog: Any, mergers: list[StackMerger]
) -> None:
    # Execute
    with caplog.at_level(logging.INFO, logger="rayfed.tuning.trials"):
        study = tune(
            _base(tmp_path),
            SPACE,
            n_trials=4,
            study_name="packed",
            study_dir=tmp_path / "study",
            pruner="median",
            pruner_warmup=1,
            parallel_trials=2,
        )
    # Assert: one line says the trials train packed, and their stacks did merge
    assert [r.getMessage() for r in caplog.records if "train packed" in r.getMessage()] != []
    assert len(mergers) == 1 and mergers[0].merged > 0 and mergers[0].live == 0
    finished = [t for t in study.get_trials() if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 4
    # the best trial, run alone, gives its numbers
    _assert_equals_its_run_alone(study.best_trial, _base(tmp_path), tmp_path / "alone")


@pytest.mark.timeout(900)
def test_rayfed_tune_parallel_4_packed_resumes_after_ctrl_c_to_its_trials(
    tmp_path: Path, caplog: Any, mergers: list[StackMerger]
) -> None:
    # Prepare: `rayfed tune --parallel 4` over lr and lambda on the tiny cwFedAvg config, stacked; successive
    # halving judges a trial at round 1 once another trial has completed.
    rounds, trials = 3, 5
    base = _base(tmp_path, **{"train.rounds": rounds})
    (tmp_path / "base.json").write_text(base.to_json())
    (tmp_path / "space.json").write_text(json.dumps(SPACE))
    study_dir = tmp_path / "study"
    args = [
        *("tune", str(tmp_path / "space.json"), str(tmp_path / "base.json"), "--trials", str(trials)),
        *("--parallel", "4", "--study-name", "ctrl-c", "--study-dir", str(study_dir), "--no-plots"),
        *("--pruner", "successive_halving", "--pruner-warmup", "1"),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "rayfed", *args], cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:

        def all_ran_a_round() -> bool:
            assert process.poll() is None, "rayfed tune ended before its four trials ran a round"
            return all((study_dir / f"trial_000{n}" / "rounds.parquet").exists() for n in range(4))

        wait_until(all_ran_a_round, "the four trials did not all run a round", limit_s=600)
        process.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = process.communicate(timeout=300)  # a guard against a hang, not a measure
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    # Assert: the trials trained packed; one Ctrl-C stopped each after a round, as interrupted.
    assert process.returncode == 130, err[-3000:]
    assert "tune: the 4 trials at once train packed" in err and "Traceback" not in err
    assert f"study 'ctrl-c' interrupted: 0 of {trials} trials finished; resume it with: rayfed tune " in out
    storage = f"sqlite:///{study_dir / 'study.db'}"
    stopped = optuna.load_study(study_name="ctrl-c", storage=storage).get_trials()
    assert [t.number for t in stopped] == [0, 1, 2, 3]
    _interrupted_trials_stopped_after_a_round(study_dir, stopped, rounds)

    # Execute: the same command again resumes the study (here, so that its merger is counted).
    with caplog.at_level(logging.INFO, logger="rayfed.tuning.trials"):
        assert main(args) == 0

    # Assert: packed again; each stopped trial retried once with its parameters; the study holds the trials it
    # was asked for, none lost or run twice; the pruner judged its trials; the best equals its run alone.
    assert any("tune: the 4 trials at once train packed" in r.getMessage() for r in caplog.records)
    assert len(mergers) == 1 and mergers[0].merged > 0 and mergers[0].live == 0
    study = optuna.load_study(study_name="ctrl-c", storage=storage)
    after = study.get_trials()
    assert [t.number for t in after] == list(range(4 + trials))
    retries = [t for t in after if attrs.RETRY_OF in t.user_attrs]
    assert sorted(t.user_attrs[attrs.RETRY_OF] for t in retries) == [0, 1, 2, 3]
    assert all(t.params == stopped[t.user_attrs[attrs.RETRY_OF]].params for t in retries)
    assert [t.number for t in finished_trials(study)] == list(range(4, 4 + trials))
    assert {t.state for t in after[4:]} <= {TrialState.COMPLETE, TrialState.PRUNED}
    dirs = {t.user_attrs[attrs.RUN_DIR] for t in after}
    assert dirs == {str((study_dir / f"trial_{n:04d}").resolve()) for n in range(4 + trials)}
    judged = [t for t in after if t.state == TrialState.PRUNED or "completed_rung_0" in t.system_attrs]
    assert judged, [(t.number, t.state, t.intermediate_values) for t in after]
    _assert_equals_its_run_alone(study.best_trial, base, tmp_path / "alone")


def test_trials_that_cannot_pack_train_alone_and_the_log_says_why(tmp_path: Path, caplog: Any) -> None:
    base = _base(tmp_path, **{"engine.vectorize": "off", "train.rounds": 1})
    with caplog.at_level(logging.INFO, logger="rayfed.tuning.trials"):
        tune(base, SPACE, n_trials=2, study_name="alone", study_dir=tmp_path / "s", pruner="none", parallel_trials=2)
    lines = [r.getMessage() for r in caplog.records if "train alone" in r.getMessage()]
    assert len(lines) == 1 and "engine.vectorize='off'" in lines[0]


@pytest.mark.parametrize("backend, packs", [("local", True), ("ray", False)])
def test_trials_at_once_pack_on_the_local_backend_and_on_ray_the_log_says_why_not(
    tmp_path: Path, caplog: Any, backend: str, packs: bool
) -> None:
    base = _base(tmp_path, **{"engine.backend": backend})
    runner = TrialRunner(base, SearchSpace(SPACE), "s", tmp_path / "s", lambda r: r.best_accuracy, None, None)
    with caplog.at_level(logging.INFO, logger="rayfed.tuning.trials"):
        chosen = packed(runner, 2)
    (line,) = [r.getMessage() for r in caplog.records]
    assert (chosen.merger is not None) == packs
    assert ("train packed" in line) == packs and ("on Ray" in line) == (not packs), line
