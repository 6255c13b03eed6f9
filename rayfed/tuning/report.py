"""What a finished study shows: a table of the best trials and plots in the study directory.

Plots use ``optuna.visualization.matplotlib`` (``pip install 'rayfed[tune]'``). A plot
that cannot be drawn (matplotlib missing, too few finished trials) is skipped with a
warning naming the reason; the study itself is never affected.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

import rayfed.tuning.attrs as attrs

__all__ = ["best_trials_table", "write_plots", "format_value"]

logger = logging.getLogger(__name__)


def best_trials_table(study: optuna.Study, top: int = 10) -> str:
    """The ``top`` best trials, complete ones first, then pruned ones (whose value is their last round's accuracy).

    Columns: trial number, state (``PRUNED@r`` names the round), value, rounds run, one column per parameter.
    """
    reverse = study.direction == optuna.study.StudyDirection.MAXIMIZE
    rows: list[FrozenTrial] = []
    for state in (TrialState.COMPLETE, TrialState.PRUNED):
        trials = [t for t in study.get_trials(deepcopy=False, states=(state,)) if t.value is not None]
        rows += sorted(trials, key=lambda t: t.value, reverse=reverse)  # type: ignore[arg-type, return-value]
    rows = rows[:top]
    names = list(dict.fromkeys(name for t in rows for name in t.params))
    header = ["trial", "state", "value", "rounds", *names]
    body = [
        [
            str(t.number),
            _state(t),
            format_value(t.value),
            format_value(t.user_attrs.get(attrs.ROUNDS_RUN)),
            *(format_value(t.params.get(n)) for n in names),
        ]
        for t in rows
    ]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(cell.rjust(w) if i != 1 else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths)))
        for r in [header, *body]
    ]
    counts = {s.name.lower(): len(study.get_trials(deepcopy=False, states=(s,))) for s in TrialState}
    summary = ", ".join(f"{n} {name}" for name, n in counts.items() if n)
    return "\n".join([f"study {study.study_name!r}: {summary or 'no trials'}", *lines])


def write_plots(study: optuna.Study, directory: str | Path) -> list[Path]:
    """Write optimisation history, intermediate values and parameter importances as PNGs; return the files."""
    if importlib.util.find_spec("matplotlib") is None:
        logger.warning("no plots: they need matplotlib (pip install 'rayfed[tune]')")
        return []
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as vis

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    plots: dict[str, Callable[[], Any]] = {
        "optimization_history": lambda: vis.plot_optimization_history(study),
        "intermediate_values": lambda: vis.plot_intermediate_values(study),
        "param_importances": lambda: vis.plot_param_importances(study, evaluator=_importance_evaluator()),
    }
    written = []
    for name, draw in plots.items():
        reason = _cannot_plot(study, name)
        if reason:
            logger.warning("no %s plot: %s", name, reason)
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                axes = draw()
        except (ValueError, RuntimeError, ImportError) as e:
            logger.warning("no %s plot: %s", name, e)
            continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        path = directory / f"{name}.png"
        figure.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written


def _cannot_plot(study: optuna.Study, name: str) -> str | None:
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if name == "optimization_history" and not complete:
        return "no complete trial yet"
    if name == "param_importances":
        if len(complete) < 2:
            return f"parameter importances need at least 2 complete trials, but the study has {len(complete)}"
        varied = {n for n in complete[0].params if len({repr(t.params.get(n)) for t in complete}) > 1}
        if not varied:
            return "no parameter takes two different values among the complete trials"
    if name == "intermediate_values" and not any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
        return "no trial reported a round"
    return None


def _importance_evaluator() -> optuna.importance.BaseImportanceEvaluator:
    """fANOVA (Optuna's default) needs scikit-learn; without it fall back to PED-ANOVA, which does not."""
    if importlib.util.find_spec("sklearn") is not None:
        return optuna.importance.FanovaImportanceEvaluator(seed=0)
    logger.warning("parameter importances by PED-ANOVA: fANOVA needs scikit-learn (pip install 'rayfed[tune]')")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.importance.PedAnovaImportanceEvaluator()


def _state(trial: FrozenTrial) -> str:
    pruned_round = trial.user_attrs.get(attrs.PRUNED_ROUND)
    if trial.state == TrialState.PRUNED and pruned_round is not None:
        return f"PRUNED@{pruned_round}"
    return trial.state.name


def format_value(value: Any) -> str:
    """A trial's value, rounds or parameter as the table and the trial lines show it: 4 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)
