"""A table's report: Markdown (ours as mean ± std over seeds beside the papers' values) and one figure per column.

Rounds count as in the papers' logs: round r is the model after r rounds of training
(``rounds.parquet`` row ``round = r - 1``) and round 0 the initial model (the row
``round = -1`` that ``engine.eval_initial`` writes). Each row is scored on its own column
(:func:`~rayfed.reproduce.spec.row_metric`: the model it reports, summed up as the table sums
up accuracies): the score of a run is that column's best value over rounds 1..R (the papers'
"best round"), or its value at the round of the lowest test loss for a row that selects so
(FedClassAvg's code). The standard deviation is NumPy's (population) std over the seeds, as
PFLlib prints it. The report's header lists, per row, the model it reports, the fidelity it
runs and the settings that are choices rather than its reference's. Where a table ran with privacy
(``privacy.mechanism``, docs/privacy.md), each cell and run also carries the ε its runs spent over rounds 1..R
(``rounds.parquet``'s ``epsilon`` after round R, at ``privacy.delta``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rayfed.engine.metrics import counted_round
from rayfed.engine.privacy_records import EPSILON
from rayfed.reproduce.run_files import read_rounds
from rayfed.reproduce.runner import Cell, Outcome, fetch_command
from rayfed.reproduce.spec import Row, RowMetric, Table, papers_cited, row_metric
from rayfed.util.files import atomic_write, write_json

__all__ = ["Score", "score_run", "write_report", "draw_figures"]


@dataclass(frozen=True)
class Score:
    """One run over its first R rounds: best value, where, the values at chosen rounds, and the curve."""

    best: float
    best_round: int
    final: float
    at: dict[int, float]
    curve: list[tuple[int, float]]
    """(round, value) with round 0 = the initial model, when it was evaluated."""
    seconds_per_round: float
    """Median wall time of rounds 1..R (``round_s``), NaN where the run did not record it."""
    epsilon: float | None = None
    """ε spent over rounds 1..R where the run had privacy on (inf: no noise); None without privacy."""


def score_run(
    directory: Path, metric: RowMetric, rounds: int, scale: float, at_rounds: Sequence[int] = ()
) -> Score | None:
    """The score of the run in ``directory`` on ``metric`` over rounds 1..``rounds``; None until its
    ``rounds.parquet`` has that many (a longer run, or one stopped past them, is scored on its first ``rounds``),
    or, selecting by test loss, while no scored round has one."""
    if rounds_recorded(directory) < rounds:
        return None
    rows = read_rounds(directory)
    curve = [
        (counted_round(int(r["round"])), scale * float(r[metric.column]))
        for r in rows
        if r["round"] < rounds and _finite(r.get(metric.column))
    ]
    trained = [(x, v) for x, v in curve if x >= 1]
    if metric.select == "lowest_test_loss":
        losses = {
            counted_round(int(r["round"])): float(r[metric.loss_column])
            for r in rows
            if _finite(r.get(metric.loss_column))
        }
        trained = [(x, v) for x, v in trained if x in losses]
        pick = functools.partial(min, key=lambda point: losses[point[0]])  # the first of equal minima
    else:
        pick = functools.partial(max, key=lambda point: point[1])  # the first of equal maxima
    if not trained:
        return None
    best_round, best = pick(trained)
    values = dict(curve)
    times = [float(r["round_s"]) for r in rows if 0 <= r["round"] < rounds and r.get("round_s") is not None]
    seconds = float(np.median(times)) if times else math.nan
    spent = [r.get(EPSILON) for r in rows if r["round"] == rounds - 1]
    epsilon = float(spent[0]) if spent and spent[0] is not None else None
    at = {a: values.get(a, math.nan) for a in at_rounds}
    return Score(best, best_round, trained[-1][1], at, curve, seconds, epsilon)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def rounds_recorded(directory: Path | None) -> int:
    """Training rounds in a run's ``rounds.parquet`` so far (a stopped or running run included; a damaged one has
    none: :func:`~rayfed.reproduce.run_files.read_rounds`)."""
    return sum(1 for r in read_rounds(directory, ["round"]) if r["round"] >= 0)


def _progress(group: Sequence[Cell], rounds: int) -> str:
    """What a cell without a score has: "not run", or the most rounds any of its seeds has recorded."""
    done = max((rounds_recorded(cell.run_dir) for cell in group), default=0)
    return f"{done} of {rounds} rounds so far" if done else "not run"


def _mean_std(values: Sequence[float], digits: int) -> str:
    finite = np.array([v for v in values if not math.isnan(v)])
    if len(finite) == 0:
        return "–"
    if len(finite) == 1:
        return f"{finite[0]:.{digits}f}"
    return f"{finite.mean():.{digits}f} ± {finite.std():.{digits}f}"


def _range(values: Sequence[float], digits: int) -> str:
    """The seed spread as ``min – max`` (one seed, or none: "–")."""
    finite = [v for v in values if not math.isnan(v)]
    return f"{min(finite):.{digits}f} – {max(finite):.{digits}f}" if len(finite) > 1 else "–"


def _scores(cells: Sequence[Cell], table: Table, rounds: int, at_rounds: Sequence[int]) -> dict[Cell, Score]:
    found = {}
    for cell in cells:
        if cell.run_dir is not None:
            score = score_run(cell.run_dir, row_metric(table, cell.row), rounds, table.scale, at_rounds)
            if score is not None:
                found[cell] = score
    return found


def write_report(
    table: Table,
    cells: Sequence[Cell],
    out: Path,
    *,
    rounds: int,
    at_rounds: Sequence[int] = (),
    outcomes: dict[Cell, Outcome] | None = None,
    command: str = "",
) -> Path:
    """Write ``out/<table>.md`` and ``.json`` from the cells' run directories; returns the Markdown's path."""
    digits = 2 if table.scale >= 10 else 4
    scores = _scores(cells, table, rounds, at_rounds)
    rows = list(dict.fromkeys(c.row.key for c in cells))
    columns = list(dict.fromkeys(c.column.key for c in cells))
    by = {
        (c.row.key, c.column.key): [x for x in cells if x.row.key == c.row.key and x.column.key == c.column.key]
        for c in cells
    }
    lines = _preamble(table, rounds)
    if any(s.epsilon is not None for s in scores.values()):
        lines += [f"ε: the privacy the runs spent over rounds 1..{rounds} (docs/privacy.md), the most of any seed.", ""]
    lines += _row_choices(table, rows, by)
    table_lines, blocked = _main_table(table, rows, columns, by, scores, rounds, digits)
    lines += table_lines
    lines += _unfinished(table, blocked, outcomes or {})
    if at_rounds:
        lines += _at_rounds(table, rows, columns, by, scores, at_rounds, digits)
    lines += _per_run(scores, digits)
    if command:
        lines += ["", f"Written by `{command}`."]
    path = out / f"{table.name}.md"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    write_json(out / f"{table.name}.json", _summary(table, scores, rounds))
    return path


def _preamble(table: Table, rounds: int) -> list[str]:
    """The report's title, what "ours" and "paper" mean, and the papers the table cites."""
    unit = "%" if table.scale == 100 else "fraction"
    statistic = "pooled over the clients' test samples" if table.metric == "accuracy" else "mean over clients"
    return [
        f"# {table.name}: {table.title}",
        "",
        f"Source: {table.source}. Ours: each row's accuracy ({unit}, {statistic}) at its scored round over rounds "
        f"1..{rounds}, mean ± std over seeds [seeds finished; median scored round]. Papers: "
        f"{table.paper_rounds or 'unstated'} rounds." + (f" {table.notes}" if table.notes else ""),
        "",
        *(f"- {citation}" for citation in papers_cited(f"{table.source} {table.notes}")),
        "",
    ]


def _main_table(
    table: Table,
    rows: list[str],
    columns: list[str],
    by: dict[tuple[str, str], list[Cell]],
    scores: dict[Cell, Score],
    rounds: int,
    digits: int,
) -> tuple[list[str], dict[str, str]]:
    """The table itself: per row and column, ours (mean ± std over seeds, or how far the runs got) beside the
    paper's; and, per reason a row is not run in this version, the first row it blocks."""
    header = [f"{table.column(k).label}: {kind}" for k in columns for kind in ("ours", "paper")]
    lines = ["| method | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
    blocked: dict[str, str] = {}
    for row in rows:
        cellsrow = []
        for col in columns:
            group = by[(row, col)]
            reason = group[0].blocked
            if reason:
                blocked.setdefault(reason, table.row(row).label)
                text = "not available in this version" if "not available" in reason else "config refused"
            else:
                found = [scores[c] for c in group if c in scores]
                text = (
                    (
                        f"{_mean_std([s.best for s in found], digits)} [{len(found)}/{len(group)}; "
                        f"r{int(np.median([s.best_round for s in found]))}{_spent(found)}]"
                    )
                    if found
                    else _progress(group, rounds)
                )
            cellsrow += [text, table.row(row).paper.get(col, "–")]
        lines.append(
            f"| {table.row(row).label} ({row_metric(table, table.row(row)).model}) | " + " | ".join(cellsrow) + " |"
        )
    return lines, blocked


def _spent(found: Sequence[Score]) -> str:
    """ "; ε=<the most any seed spent>" where the runs had privacy on; "" without."""
    spent = [s.epsilon for s in found if s.epsilon is not None]
    return f"; ε={max(spent):.3g}" if spent else ""


def _unfinished(table: Table, blocked: dict[str, str], outcomes: dict[Cell, Outcome]) -> list[str]:
    """The lists of what has no score and why: rows not run in this version, columns whose data are missing (with
    the command that fetches them), failed runs."""
    lines: list[str] = []
    if blocked:
        lines += ["", "Not run in this version:", ""] + [f"* {label}: {reason}" for reason, label in blocked.items()]
    missing = {c.column.key: (c, o) for c, o in outcomes.items() if o.status == "data missing"}
    if missing:
        lines += ["", "Columns whose data are missing (fetch them, then run the same command again):", ""]
        for key, (cell, outcome) in missing.items():
            assert cell.config is not None
            lines.append(f"* {table.column(key).label}: {outcome.message}\n  fetch: `{fetch_command(cell.config)}`")
    failed = [(c, o) for c, o in outcomes.items() if o.status == "failed"]
    if failed:
        lines += ["", "Failed runs:", ""] + [
            f"* {c.row.label}, {c.column.label}, seed {c.seed}: {o.message}" for c, o in failed
        ]
    return lines


def _per_run(scores: dict[Cell, Score], digits: int) -> list[str]:
    """One line per scored run: its scored value and round, final value, time per round, the ε it spent where it
    had privacy on, and its run directory."""
    private = any(s.epsilon is not None for s in scores.values())
    lines = [
        "",
        "Per run (s/round: median wall time of a round):",
        "",
        "| column | method | seed | scored | scored round | final | s/round |"
        + (" ε |" if private else "")
        + " run directory |",
        "|---|---|---|---|---|---|---|" + ("---|" if private else "") + "---|",
    ]
    for cell, s in scores.items():
        name = cell.run_dir.name if cell.run_dir else ""
        spent = f" {'–' if s.epsilon is None else f'{s.epsilon:.3g}'} |" if private else ""
        lines.append(
            f"| {cell.column.label} | {cell.row.label} | {cell.seed} | {s.best:.{digits}f} | {s.best_round} "
            f"| {s.final:.{digits}f} | {s.seconds_per_round:.1f} |{spent} {name} |"
        )
    return lines


def _summary(table: Table, scores: dict[Cell, Score], rounds: int) -> dict[str, object]:
    """The report's JSON: every scored run's score (without its curve) and where it came from."""
    return {
        "table": table.name,
        "metric": table.metric,
        "rounds": rounds,
        "runs": [
            {
                "row": c.row.key,
                "column": c.column.key,
                "seed": c.seed,
                "run_dir": str(c.run_dir),
                "scored": row_metric(table, c.row).column,
                **{k: v for k, v in asdict(s).items() if k not in ("curve", "epsilon")},
                **({} if s.epsilon is None else {EPSILON: s.epsilon if math.isfinite(s.epsilon) else None}),
            }
            for c, s in scores.items()
        ],
    }


def _row_choices(table: Table, rows: list[str], by: dict[tuple[str, str], list[Cell]]) -> list[str]:
    """The header's list: per row, the model it reports, the fidelity it runs, and its settings that are choices."""
    lines = [
        "What each row reports and runs (fidelity: the method's `fidelity` switch, docs/algorithms.md; "
        "– = the method has no switch, one implementation):",
        "",
        "| method | reports | fidelity | choices |",
        "|---|---|---|---|",
    ]
    for key in rows:
        row = table.row(key)
        cells = [c for (r, _), group in by.items() if r == key for c in group]
        lines.append(
            f"| {row.label} | {row_metric(table, row).describe()} | {_fidelity(row, cells)} | {row.choices or '–'} |"
        )
    return lines + [""]


def _fidelity(row: Row, cells: Sequence[Cell]) -> str:
    """``fidelity=<value>`` of the row's algorithm (and of a borrowed client half), as its cells run it; "–" without."""
    config = next((c.config for c in cells if c.config is not None), None)
    if config is None:
        return f"fidelity={row.params['fidelity']}" if "fidelity" in row.params else "–"
    halves = (("", config.algorithm.params), (config.algorithm.client, config.algorithm.client_params))
    parts = [
        f"{owner}: fidelity={params.fidelity}" if owner else f"fidelity={params.fidelity}"
        for owner, params in halves
        if hasattr(params, "fidelity")
    ]
    return "; ".join(parts) or "–"


def _at_rounds(
    table: Table,
    rows: list[str],
    columns: list[str],
    by: dict[tuple[str, str], list[Cell]],
    scores: dict[Cell, Score],
    at_rounds: Sequence[int],
    digits: int,
) -> list[str]:
    """One table per column: mean ± std over seeds at each chosen round (0 = the initial model) and of the
    best, then the best's spread over seeds (lowest – highest seed)."""
    lines = []
    for col in columns:
        lines += [
            "",
            f"{table.column(col).label}: each row's column at chosen rounds (mean ± std over seeds)",
            "",
            "| method | " + " | ".join(f"round {a}" for a in at_rounds) + " | scored | scored: seed range |",
            "|---|" + "---|" * (len(at_rounds) + 2),
        ]
        for row in rows:
            found = [scores[c] for c in by[(row, col)] if c in scores]
            if not found:
                continue
            values = [_mean_std([s.at[a] for s in found], digits) for a in at_rounds]
            values += [_mean_std([s.best for s in found], digits), _range([s.best for s in found], digits)]
            lines.append(f"| {table.row(row).label} | " + " | ".join(values) + " |")
    return lines


def draw_figures(table: Table, cells: Sequence[Cell], out: Path, *, rounds: int) -> list[Path]:
    """``out/figures/<table>-<column>.png``: per method, the mean curve over seeds with a band of ± 1 std."""
    from matplotlib.figure import Figure

    scores = _scores(cells, table, rounds, ())
    paths = []
    for col in dict.fromkeys(c.column.key for c in cells):
        fig = Figure(figsize=(6.4, 4.2))
        ax = fig.add_subplot()
        drawn = 0
        for i, row in enumerate(dict.fromkeys(c.row.key for c in cells)):
            curves = [dict(scores[c].curve) for c in cells if c.row.key == row and c.column.key == col and c in scores]
            if not curves:
                continue
            xs = sorted(set.intersection(*(set(c) for c in curves)))
            values = np.array([[c[x] for x in xs] for c in curves])
            mean, std = values.mean(axis=0), values.std(axis=0)
            colour, style = f"C{i % 10}", ("-", "--", ":")[i // 10 % 3]  # past 10 rows, colours repeat dashed
            ax.plot(xs, mean, color=colour, linestyle=style, label=f"{table.row(row).label} ({len(curves)} seeds)")
            ax.fill_between(xs, mean - std, mean + std, color=colour, alpha=0.2, linewidth=0)
            drawn += 1
        if not drawn:
            continue
        ax.set_xlabel("round (0 = initial model)")
        ax.set_ylabel(f"{table.metric} ({'%' if table.scale == 100 else 'fraction'})")
        ax.set_title(f"{table.name}: {table.column(col).label}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        path = out / "figures" / f"{table.name}-{col}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, functools.partial(fig.savefig, format="png", dpi=120, bbox_inches="tight"))
        paths.append(path)
    return paths
