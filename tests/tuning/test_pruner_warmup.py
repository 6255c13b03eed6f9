"""A pruner judges a trial only after its warm-up rounds; parallel trials are asked with TPE's constant liar."""

from __future__ import annotations

import math
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState

from rayfed import ConfigError
from rayfed.cli import main
from rayfed.tuning import FloatParam, PruningCallback, attrs, tune
from rayfed.tuning.pruning import default_warmup
from rayfed.tuning.study import SAMPLERS
from tests.tuning.test_tuning import base_config


class _AlwaysPrune:
    """A trial whose pruner would stop it at any round it is asked about; it records what it was told."""

    def __init__(self) -> None:
        self.reported: list[int] = []
        self.asked: list[int] = []

    def report(self, value: float, step: int) -> None:
        self.reported.append(step)

    def should_prune(self) -> bool:
        self.asked.append(self.reported[-1])
        return True


def _record(round_: int, accuracy: float = 0.5) -> SimpleNamespace:
    """What the callback reads of a round's record."""
    return SimpleNamespace(round=round_, accuracy=accuracy)


def test_the_pruner_is_asked_only_after_the_warm_up_rounds_every_round_still_reported() -> None:
    trial = _AlwaysPrune()
    callback = PruningCallback(trial, warmup_rounds=3)  # type: ignore[arg-type]
    stops = [callback.after_round(None, _record(t), None) for t in (-1, 0, 1, 2)]  # type: ignore[arg-type]
    assert stops == [False] * 4 and trial.asked == [] and trial.reported == [-1, 0, 1, 2]
    assert callback.after_round(None, _record(3), None) and callback.pruned_round == 3  # type: ignore[arg-type]
    assert trial.asked == [3]
    # without a warm-up the first trained round is judged (the initial evaluation, round -1, never is)
    bare = PruningCallback(_AlwaysPrune())  # type: ignore[arg-type]
    assert not bare.after_round(None, _record(-1), None)  # type: ignore[arg-type]
    assert bare.after_round(None, _record(0), None) and bare.pruned_round == 0  # type: ignore[arg-type]
    assert not bare.after_round(None, _record(5, math.nan), None)  # type: ignore[arg-type]


def test_the_default_warm_up_is_a_quarter_of_the_rounds() -> None:
    assert [default_warmup(r) for r in (1, 3, 4, 10, 50, 1000)] == [0, 0, 1, 2, 12, 250]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_a_bad_warm_up_is_refused_naming_it(tmp_path, bad) -> None:
    with pytest.raises(ConfigError, match=rf"pruner_warmup must be an integer >= 0 .* pruner_warmup={bad!r}"):
        tune(base_config(tmp_path), {"train.lr": FloatParam(0.01, 0.1)}, n_trials=1, pruner_warmup=bad)
    assert not (tmp_path / "runs").exists()


def _prune_study(tmp_path, **kwargs) -> optuna.Study:
    """A good trial, then a hopeless one (lr 1e-7 learns nothing) under a median pruner that may judge from the
    second trial on, 4 rounds each."""
    storage = f"sqlite:///{tmp_path / 'prune.db'}"
    waiting = optuna.create_study(storage=storage, study_name="warm", direction="maximize")
    waiting.enqueue_trial({"train.lr": 0.05})
    waiting.enqueue_trial({"train.lr": 1e-7})
    return tune(
        base_config(tmp_path, **{"train.rounds": 4}),
        {"train.lr": FloatParam(1e-7, 0.1, log=True)},
        n_trials=2,
        study_name="warm",
        study_dir=tmp_path / "study",
        storage=storage,
        pruner=optuna.pruners.MedianPruner(n_startup_trials=1),
        **kwargs,
    )


@pytest.mark.slow
@pytest.mark.parametrize(("warmup", "pruned_at"), [(None, 1), (2, 2), (0, 0)])
def test_a_hopeless_trial_is_pruned_only_after_its_warm_up(tmp_path, warmup, pruned_at) -> None:
    study = _prune_study(tmp_path, pruner_warmup=warmup)  # None: the default, 4 rounds // 4 = 1
    good, hopeless = study.get_trials()
    assert good.state == TrialState.COMPLETE
    assert hopeless.state == TrialState.PRUNED and hopeless.user_attrs[attrs.PRUNED_ROUND] == pruned_at
    assert list(hopeless.intermediate_values) == list(range(pruned_at + 1))


def test_pruner_warmup_on_the_command_line_is_checked_before_anything_is_written(tmp_path, capsys) -> None:
    space = tmp_path / "lr.yaml"
    space.write_text("train.lr: {type: float, low: 0.01, high: 0.1, log: true}\n")
    study_dir = tmp_path / "study"
    code = main(["tune", str(space), "train.rounds=8", "--study-dir", str(study_dir), "--pruner-warmup", "-2"])
    assert code != 0 and "--pruner-warmup must be an integer >= 0" in capsys.readouterr().err
    assert not study_dir.exists()


def test_a_batch_of_parallel_trials_is_asked_with_tpes_constant_liar() -> None:
    assert SAMPLERS["tpe"](0, 4)._constant_liar and not SAMPLERS["tpe"](0, 1)._constant_liar
    assert isinstance(SAMPLERS["random"](0, 4), optuna.samplers.RandomSampler)
