"""Figures from finished runs: accuracy curves, p against p̃, output-layer row norms.

    rayfed plot RUN_DIR [RUN_DIR ...] --out DIR

writes, into ``DIR``:

* ``accuracy.png``: pooled test accuracy against the round, counted as the progress bar counts
  it (1 = the first round; 0 = the initial model, evaluated with ``engine.eval_initial``), one
  line per run; beside it, where a run has a system model, against its virtual time in the unit that fits
  (seconds, minutes, hours or days: ``virtual_time_s``, docs/system.md), and where a run ran with privacy, against
  the ε it had spent (``epsilon``, docs/privacy.md). Runs whose configs differ in the seed alone
  (:meth:`~rayfed.config.RunConfig.diff`, ignoring ``seed`` and the fields that change no number,
  :data:`~rayfed.results.run_data.SAME_NUMBERS`) are seeds of one method and share a colour and a
  legend entry; the legend, below the axes, names the method (``Algorithm.label``) and, where
  lines share that name, the fields that tell them apart (``cwFedAvg (Output), train.lr=0.01``);
  a note under it explains the labels' parts (``Reporting.label_note``). A run without a round
  yet is left out (none with one: nothing is drawn);
* ``<run>-timeline.png``, for a synchronous run with a system model: who trained when, one line per sampled
  client and round, coloured by what became of its work (:func:`plot_timeline`);
* the figures a run's method draws of itself from its newest checkpoint, as its server half
  says (``Reporting.figures``), as ``<run>-<figure>.png`` (``<run>`` is the run directory's
  name). cwFedAvg draws those of Lee & Choi, "Class-Wise Federated Averaging for Efficient
  Personalization", ICCV 2025 (:mod:`rayfed.algorithms.cwfedavg_figures`): ``p_vs_p_tilde``
  (Fig. 2c), ``norms_local`` (Fig. 3) and ``norms_global`` (Fig. 6). Methods that draw none get
  only their accuracy curve, and so does a run whose method this process does not hold: drawing runs none of a
  run's code, so a method of a plugin that is not imported here is named as skipped
  (:mod:`rayfed.results.run_data`).

The clients' class counts come from ``label_counts.parquet``, which the engine writes next to
the partition; an older run without it gets its accuracy curve only, with a note that says why: drawing never
loads, extracts or downloads the dataset a run's ``config.json`` names.

matplotlib is imported lazily (``pip install 'rayfed[plots]'``); figures are drawn on
``matplotlib.figure.Figure`` objects, so no pyplot state or GUI backend is touched.
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rayfed.algorithms import ALGORITHMS
from rayfed.algorithms.figures import DistributionPairs, Figure, Heatmap
from rayfed.config import RunConfig
from rayfed.data import LABEL_COUNTS_FILE
from rayfed.provenance.run_dir import resume_command
from rayfed.results.run_data import (
    CurveGroup,
    RunData,
    accuracy_points,
    client_timeline,
    curve_groups,
    epsilon_points,
    finished_run,
    load_run,
    longest_virtual_time,
    method_label,
    time_unit,
    virtual_time_points,
)
from rayfed.util.errors import ConfigError, RayfedError
from rayfed.util.files import atomic_write

logger = logging.getLogger(__name__)

__all__ = [
    "RunData",
    "CurveGroup",
    "load_run",
    "method_label",
    "curve_groups",
    "accuracy_points",
    "virtual_time_points",
    "epsilon_points",
    "finished_run",
    "plot_accuracy_curves",
    "plot_timeline",
    "plot_p_vs_p_tilde",
    "plot_row_norms",
    "plot_run_figures",
    "write_figures",
]

_BARS_SHOWN = 4
# --- drawing ------------------------------------------------------------------------------------


def _figure_class() -> type:
    """matplotlib's ``Figure``, or an error that says how to install it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise RayfedError(
            f"figures need matplotlib, which cannot be imported ({e}); install it with: pip install 'rayfed[plots]'"
        ) from e
    return Figure


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    return path


def plot_accuracy_curves(runs: Sequence[RunData], path: str | Path) -> Path:
    """Pooled accuracy against the round, one line per run, one colour per method (:func:`curve_groups`); beside
    it, where a run has a system model, against virtual time in the unit that fits the runs (:func:`time_unit`,
    docs/system.md)."""
    from matplotlib.ticker import MaxNLocator

    timed = any(virtual_time_points(run)[0] for run in runs)
    private = any(epsilon_points(run)[0] for run in runs)
    unit, unit_s = time_unit(longest_virtual_time(runs))
    panels = 1 + timed + private
    fig = _figure_class()(figsize=(7.5 + 5.5 * (panels - 1), 4.5))
    axes = fig.subplots(1, panels, squeeze=False)[0]
    ax = axes[0]
    _draw_curves(ax, runs, accuracy_points)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round (1 = the first; 0 = the initial model)")
    if timed:
        _draw_curves(axes[1], runs, lambda run, column="accuracy": virtual_time_points(run, column, unit_s))
        axes[1].set_xlabel(f"virtual time ({unit}; runs without a system model: none)")
    if private:  # accuracy against the privacy spent (docs/privacy.md)
        _draw_curves(axes[-1], runs, epsilon_points)
        axes[-1].set_xscale("log")
        deltas = {run.config.privacy.delta for run in runs if epsilon_points(run)[0]}
        at = f" at delta={deltas.pop():g}" if len(deltas) == 1 else ""
        axes[-1].set_xlabel(f"epsilon spent{at} (runs without privacy: none)")
    for each in axes:
        each.set_ylabel("pooled test accuracy (%)")
        each.grid(alpha=0.3)
    data = {(run.config.data.dataset, run.config.data.partition) for run in runs}
    on = f"\n{' '.join(data.pop())}" if len(data) == 1 else ""
    title = (
        f"Accuracy of the clients' models (pooled over test samples; dashed: global model){on}"
        if any(accuracy_points(run, "global_accuracy")[0] for run in runs)
        else f"Accuracy of the clients' models (pooled over test samples){on}"
    )
    (fig.suptitle if panels > 1 else ax.set_title)(title, fontsize="medium")
    if ax.get_legend_handles_labels()[1]:  # below the axes, wrapped: long labels are never cut at the edge
        handles, labels = ax.get_legend_handles_labels()
        wrapped = [textwrap.fill(label, 70, subsequent_indent="  ") for label in labels]
        ax.legend(handles, wrapped, fontsize="small", loc="upper left", bbox_to_anchor=(0.0, -0.14), frameon=False)
    notes = sorted(
        {note for run in runs if run.method_held and (note := ALGORITHMS.get(run.algorithm).reporting.label_note)}
    )
    if notes:
        fig.text(0.01, 0.0, textwrap.fill(" ".join(notes), 110), fontsize="x-small", va="top", color="0.3")
    return _save(fig, Path(path))


def _draw_curves(ax: Any, runs: Sequence[RunData], points: Callable[..., tuple[list, list[float]]]) -> None:
    """One line per run at ``points(run)`` (and, dashed, its global model's), one colour and legend entry per
    group of seeds (:func:`curve_groups`)."""
    from matplotlib import rcParams

    cycle = [c["color"] for c in rcParams["axes.prop_cycle"]]
    for n, group in enumerate(curve_groups(runs)):
        legend: str | None = group.legend
        for run in group.runs:
            x, y = points(run)
            if not x:
                continue
            colour = cycle[n % len(cycle)]
            ax.plot(x, y, color=colour, marker="." if len(x) < 30 else None, linewidth=1.2, alpha=0.85, label=legend)
            gx, gy = points(run, "global_accuracy")
            if gx:  # the global model on the same clients: what personalisation adds is the gap
                ax.plot(
                    gx,
                    gy,
                    color=colour,
                    linestyle="--",
                    linewidth=1.0,
                    alpha=0.7,
                    label=f"{legend}: global model" if legend is not None else None,
                )
            legend = None  # one legend entry per group


_STATUS_COLOURS = {
    "finished": "tab:green",
    "partial": "tab:olive",
    "surplus": "tab:blue",
    "late": "tab:orange",
    "offline": "tab:gray",
    "dropped": "tab:red",
}


def plot_timeline(run: RunData, path: str | Path) -> Path | None:
    """Who trained when in a run with a system model (:func:`client_timeline`): one line per sampled client and
    round (an asynchronous run: per launch that arrived or was lost, from its launch), from the start of its work
    to its end, coloured by its status; the rounds' (server steps') ends as grey verticals. None for a run without
    one."""
    lines = client_timeline(run)
    if not lines:
        return None
    unit, unit_s = time_unit(float(np.nanmax(lines["end_s"])))
    fig = _figure_class()(figsize=(10.0, 5.0))
    ax = fig.subplots()
    ends = [row["virtual_time_s"] / unit_s for row in run.rounds if int(row["round"]) >= 0]
    ax.vlines(ends, -0.5, run.config.data.num_clients - 0.5, colors="0.85", linewidth=0.6)
    for status, colour in _STATUS_COLOURS.items():
        mine = lines["status"] == status
        if mine.any():
            ids, start, end = lines["client_id"][mine], lines["start_s"][mine], lines["end_s"][mine]
            ax.hlines(ids, start / unit_s, end / unit_s, colors=colour, linewidth=2.0, label=f"{status} ({mine.sum()})")
    ax.set_xlabel(f"virtual time ({unit}; grey: the rounds' ends)")
    ax.set_ylabel("client")
    ax.set_title(f"{run.name}: who trained when (one line per client's work in a round)", fontsize="medium")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return _save(fig, Path(path))


def _clients_to_show(p: np.ndarray, count: int) -> list[int]:
    """Up to ``count`` clients spread over the range, preferring ones with different dominant classes."""
    spread = list(dict.fromkeys(int(i) for i in np.linspace(0, len(p) - 1, num=min(len(p), 4 * count)).round()))
    distinct: dict[int, int] = {}  # dominant class -> first client with it
    for i in spread:
        distinct.setdefault(int(p[i].argmax()), i)
    chosen = list(distinct.values())[:count]
    chosen += [i for i in spread if i not in chosen][: count - len(chosen)]
    return sorted(chosen)


def plot_p_vs_p_tilde(
    p: np.ndarray,
    p_tilde: np.ndarray,
    path: str | Path,
    title: str = "",
    client_ids: Sequence[int] | None = None,
    estimate_label: str = "p̃ (output layer)",
) -> Path:
    """Paired bars of p_i and its estimate p̃_i for a few clients, and a scatter of every (p_ij, p̃_ij)
    (P-ICCV Fig. 2c).

    ``p`` and ``p_tilde`` are (M, K); ``client_ids`` names their rows (default 0..M-1).
    """
    p, p_tilde = np.asarray(p, dtype=np.float64), np.asarray(p_tilde, dtype=np.float64)
    ids = list(range(len(p))) if client_ids is None else [int(i) for i in client_ids]
    shown = _clients_to_show(p, _BARS_SHOWN)
    k = p.shape[1]
    fig = _figure_class()(figsize=(4 + 2.6 * len(shown), 3.8))
    grid = fig.add_gridspec(1, len(shown) + 2)
    classes = np.arange(k)
    width = 0.42
    for n, i in enumerate(shown):
        ax = fig.add_subplot(grid[0, n])
        ax.bar(classes - width / 2, p[i], width, label="p (true)", color="tab:blue")
        ax.bar(classes + width / 2, p_tilde[i], width, label=estimate_label, color="tab:orange")
        ax.set_title(f"client {ids[i]}", fontsize="medium")
        ax.set_xlabel("class")
        ax.set_ylim(0, 1)
        if k <= 20:
            ax.set_xticks(classes)
        if n == 0:
            ax.set_ylabel("share of the client's data")
            ax.legend(fontsize="small")
    ax = fig.add_subplot(grid[0, len(shown) :])
    ax.scatter(p.ravel(), p_tilde.ravel(), s=8, alpha=0.5, color="tab:purple")
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1)
    error = np.abs(p - p_tilde).sum(axis=1).mean()
    ax.set_title(f"all {len(p)} clients × {k} classes\nmean ‖p_i − p̃_i‖₁ = {error:.3f}", fontsize="medium")
    ax.set_xlabel("p_ij (true)")
    ax.set_ylabel("p̃_ij (estimated)")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, max(1.02, float(p_tilde.max()) + 0.02))
    if title:
        fig.suptitle(title, fontsize="medium")
    return _save(fig, Path(path))


def plot_row_norms(norms: np.ndarray, path: str | Path, *, rows: str, title: str) -> Path:
    """Heatmap of output-layer row norms: ``rows`` (clients or class models) × classes (P-ICCV Figs. 3, 6)."""
    norms = np.asarray(norms, dtype=np.float64)
    m, k = norms.shape
    fig = _figure_class()(figsize=(min(3 + 0.5 * k, 12), min(2.5 + 0.28 * m, 12)))
    ax = fig.add_subplot()
    image = ax.imshow(norms, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="‖W[j,:]‖₂")
    ax.set_xlabel("class j (output neuron)")
    ax.set_ylabel(rows)
    if k <= 20:
        ax.set_xticks(range(k))
    if m <= 40:
        ax.set_yticks(range(m))
    ax.set_title(title, fontsize="medium")
    return _save(fig, Path(path))


# --- everything for a set of runs ---------------------------------------------------------------


def plot_run_figures(run: RunData, out: str | Path, stem: str | None = None) -> list[Path]:
    """The figures the run's method draws of itself (``Reporting.figures``), as ``out/<stem>-<name>.png``
    (stem: the run's name); none for a method that draws none, a run without a checkpoint or without its clients'
    class counts (``label_counts.parquet``: reading a run never loads its dataset), or one whose method this
    process does not hold (a plugin's: reading a run imports none)."""
    config = run.config
    if not run.server or not isinstance(config, RunConfig) or not run.has_label_counts:
        return []
    out, stem = Path(out), stem or run.name
    figures = ALGORITHMS.get(config.algorithm.name).figures(config.algorithm.params, finished_run(run))
    label, rounds = method_label(config), (run.checkpoint_round or 0) + 1
    return [
        _draw(figure, out / f"{stem}-{figure.name}.png", f"{run.name}: {label} after {rounds} rounds")
        for figure in figures
    ]


def _draw(figure: Figure, path: Path, context: str) -> Path:
    """One figure a method described, drawn as its kind is."""
    title = f"{context}: {figure.title}"
    if isinstance(figure, DistributionPairs):
        return plot_p_vs_p_tilde(
            figure.p,
            figure.estimate,
            path,
            title=title,
            client_ids=figure.client_ids,
            estimate_label=figure.estimate_label,
        )
    if isinstance(figure, Heatmap):
        return plot_row_norms(figure.values, path, rows=figure.rows, title=title)
    raise TypeError(f"no drawing for a figure of type {type(figure).__name__}")


def _figures_folder(out: Path) -> Path:
    """Make the folder the figures go to; ConfigError naming it and the reason if it cannot be one."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"the figures' folder {str(out)!r} is a file; give --out a folder (it is made if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"the figures' folder {str(out)!r} cannot be made ({error.strerror or error}); give --out another folder"
        ) from error
    return out


def write_figures(run_dirs: Sequence[str | Path], out: str | Path) -> tuple[list[Path], list[str]]:
    """Draw every figure for ``run_dirs`` into ``out``; returns (files written, notes on what was skipped)."""
    _figure_class()  # fail before reading anything if matplotlib is missing
    loaded = [load_run(d) for d in run_dirs]
    runs = [run for run in loaded if run.has_rounds]
    if not runs:
        which = f"{str(loaded[0].run_dir)!r} has" if len(loaded) == 1 else "none of the runs given has"
        raise ConfigError(
            f"{which} no round yet (rounds.parquet holds none: its run stopped before its first round ended), so "
            f"there is nothing to draw; continue it ({resume_command(loaded[0].run_dir)}), then plot it"
        )
    out = _figures_folder(Path(out))
    paths = [plot_accuracy_curves(runs, out / "accuracy.png")]
    notes = [f"{run.run_dir}: no round yet, left out" for run in loaded if not run.has_rounds]
    stems: dict[str, int] = {}
    for run in runs:
        stem = run.name if run.name not in stems else f"{run.name}-{stems[run.name]}"
        stems[run.name] = stems.get(run.name, 0) + 1
        timeline = plot_timeline(run, out / f"{stem}-timeline.png")
        paths.extend([timeline] if timeline else [])
        drawn = plot_run_figures(run, out, stem)
        paths.extend(drawn)
        if not run.method_held:
            notes.append(
                f"{run.run_dir}: {run.algorithm} is not registered in this process (its config's plugins "
                f"{list(run.config.plugins)} are data when a run is read, never imported), so its own figures are "
                "skipped: accuracy curve only"
            )
        elif not run.server:
            notes.append(
                f"{run.run_dir}: no checkpoint (engine.checkpoint_every=0?), so no figures of the "
                f"{run.algorithm} run's own: accuracy curve only"
            )
        elif not run.has_label_counts:
            notes.append(
                f"{run.run_dir}: no {LABEL_COUNTS_FILE} (a run from before rayfed recorded its clients' class counts), "
                f"so no figures of the {run.algorithm} run's own: they read those counts, and drawing never loads the "
                "dataset a run names: accuracy curve only"
            )
        elif not drawn:
            notes.append(
                f"{run.run_dir}: {run.algorithm} run, accuracy curve only ({run.algorithm} draws no figures of its own)"
            )
    return paths, notes
