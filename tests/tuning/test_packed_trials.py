"""``rayfed tune`` with trials at once: their runs share one stack where they may (issue 64), the log says so in
one line, each trial is still pruned on its own, and the best trial's numbers are those of its run alone."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from optuna.trial import TrialState

import rayfed.tuning.attrs as attrs
from rayfed import RunConfig, run
from rayfed.execution.stack_merger import StackMerger
from rayfed.tuning import tune
from tests.conftest import tiny_overrides

pytestmark = pytest.mark.slow

SPACE = {
    "train.lr": {"type": "float", "low": 0.005, "high": 0.05, "log": True},
    "algorithm.params.wdr_lambda": {"type": "float", "low": 0.01, "high": 1.0, "log": True},
}
LOSS_RTOL, ACCURACY_ATOL = 1e-3, 0.02
"""The stacked path's run-level agreement, as tests/packs/test_run_many.py holds packed runs to."""


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


def test_parallel_trials_share_one_stack_prune_alone_and_equal_their_runs_alone(
    tmp_path: Path, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: count the stacks the trials' runs merged
    mergers: list[StackMerger] = []

    class Counted(StackMerger):
        def __init__(self) -> None:
            super().__init__()
            mergers.append(self)

    monkeypatch.setattr("rayfed.tuning.trials.StackMerger", Counted)
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
    best = study.best_trial
    alone = _base(tmp_path).override({**best.params, "run_dir": str(tmp_path / "alone")})
    run(alone)
    packed_rows = pq.read_table(Path(best.user_attrs[attrs.RUN_DIR]) / "rounds.parquet").to_pylist()
    alone_rows = pq.read_table(tmp_path / "alone" / "rounds.parquet").to_pylist()
    assert len(packed_rows) == len(alone_rows) == 3
    for mine, theirs in zip(packed_rows, alone_rows):
        assert mine["train_loss"] == pytest.approx(theirs["train_loss"], rel=LOSS_RTOL, nan_ok=True)
        assert mine["accuracy"] == pytest.approx(theirs["accuracy"], abs=ACCURACY_ATOL)


def test_trials_that_cannot_pack_train_alone_and_the_log_says_why(tmp_path: Path, caplog: Any) -> None:
    base = _base(tmp_path, **{"engine.vectorize": "off", "train.rounds": 1})
    with caplog.at_level(logging.INFO, logger="rayfed.tuning.trials"):
        tune(base, SPACE, n_trials=2, study_name="alone", study_dir=tmp_path / "s", pruner="none", parallel_trials=2)
    lines = [r.getMessage() for r in caplog.records if "train alone" in r.getMessage()]
    assert len(lines) == 1 and "engine.vectorize='off'" in lines[0]
