"""What a table costs before it runs: ``rayfed reproduce TABLE --plan``.

A cell's cost is the seconds of its rounds still to run, plus its start (data loading, partition, first-round
warm-up) when it has rounds to run. The cells of one shape (row and column: the seeds differ only in their random
numbers) share one measurement, taken from a run of that shape already under ``OUT/runs`` (its rounds' wall
times), else by **calibration**: two rounds of the shape's first cell, in a temporary folder, on this machine as
the cell would run (CPU, or its GPU share). A round costs the median of the rounds timed; where the method's local
epochs vary by round (KT-pFL's ramp, :attr:`~rayfed.algorithms.Reporting.epochs_by_round`), a round costs
``fixed + per_epoch x epochs``, fitted to rounds of different epochs (calibration then times one round more).

Wall time spreads the cells over the slots that run at once: ``--parallel``, bounded by this machine's CPUs (each
run takes one) and, with ``--gpus-per-run G``, by ``GPUs / G``; longest cells first, each to the slot free
soonest. The papers' horizon is the same table at :attr:`~rayfed.reproduce.spec.Table.paper_rounds` rounds and
:attr:`~rayfed.reproduce.spec.Table.paper_seeds` seeds, every cell from scratch; which cells pack into one stack
and what the horizon costs packed is :mod:`rayfed.reproduce.packed_cost`, from the clients' local steps of the
round timed (:attr:`ShapeCost.steps`).
"""

from __future__ import annotations

import heapq
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rayfed.algorithms.settings import resolve
from rayfed.engine.callbacks import Callback, RunView
from rayfed.engine.metrics import RoundRecord
from rayfed.reproduce.packed_cost import packing_lines
from rayfed.reproduce.report import rounds_recorded
from rayfed.reproduce.run_files import read_rounds
from rayfed.reproduce.runner import Cell, fetch_command
from rayfed.reproduce.spec import Table
from rayfed.util.errors import DatasetError, RayfedError
from rayfed.util.progress import steps

__all__ = ["ShapeCost", "CellCost", "plan_report", "shape_costs", "cell_costs", "wall_seconds", "run_slots"]

CALIBRATION_ROUNDS = 2
DATA_MISSING = "data missing"


@dataclass(frozen=True)
class ShapeCost:
    """Seconds a round of one (row, column) takes here, and a run's start; ``note`` says where they come from."""

    round_s: float
    """A round's seconds; with :attr:`epoch_s`, those of its part that does not grow with its epochs."""
    start_s: float
    note: str
    epoch_s: float = 0.0
    """Seconds each local epoch adds to a round, where the method's epochs vary by round (0: a round is a round)."""
    steps: tuple[int, ...] = ()
    """The local steps of each client trained in its last round timed (() where unknown): what packing lays into
    lanes (:mod:`rayfed.reproduce.packed_cost`)."""

    def seconds(self, epochs: Sequence[int]) -> float:
        """Seconds of rounds of ``epochs`` local epochs each (no start)."""
        return len(epochs) * self.round_s + self.epoch_s * sum(epochs)


@dataclass(frozen=True)
class CellCost:
    """One cell's rounds done and seconds still to run."""

    cell: Cell
    done: int
    """Rounds its run directory holds."""
    seconds: float | None
    """Seconds to bring it to the rounds asked (None: its shape could not be measured)."""


def _recorded_rounds(run_dir: Path | None) -> list[tuple[int, float]]:
    return [(row["round"], row["round_s"]) for row in read_rounds(run_dir, ["round", "round_s"]) if row["round"] >= 0]


def round_walls(run_dir: Path) -> list[tuple[int, float]]:
    """(round, wall seconds) of a run's rounds: each round's ``round_s`` plus what writing its checkpoint and files
    adds, the least a gap between two consecutive per-round client tables' times of writing exceeds the later
    round's ``round_s`` (a gap across a stop and resume holds the pause too, so the least one is taken). Round 0
    is left out when later ones exist: it holds the warm-up."""
    recorded = _recorded_rounds(run_dir)
    stamps = {
        int(path.stem.split("_")[1]): path.stat().st_mtime for path in (run_dir / "clients").glob("round_*.parquet")
    }
    files = [stamps[t] - stamps[t - 1] - s for t, s in recorded if t in stamps and t - 1 in stamps]
    overhead = max(min(files, default=0.0), 0.0)
    return [(t, s + overhead) for t, s in recorded[1:] or recorded]


def recorded_steps(run_dir: Path) -> tuple[int, ...]:
    """Each trained client's local steps in the last round whose client table ``run_dir`` holds (() if none)."""
    tables = sorted((run_dir / "clients").glob("round_*.parquet"))
    if not tables:
        return ()
    try:
        return _trained_steps(pq.read_table(tables[-1], columns=["steps"]))
    except (OSError, KeyError, pa.ArrowInvalid):
        return ()


def _trained_steps(clients: pa.Table) -> tuple[int, ...]:
    return tuple(int(n) for n in clients.column("steps").to_pylist() if n)


def epoch_schedule(cell: Cell, rounds: Iterable[int]) -> list[int]:
    """The local epochs each of ``rounds`` trains in ``cell``'s run: its method's schedule, else
    ``train.local_epochs``."""
    assert cell.config is not None
    algorithm = resolve(cell.config.algorithm)
    return [algorithm.local_epochs(cell.config.train, t) for t in rounds]


def fitted(cell: Cell, timed: Sequence[tuple[int, float]], note: str) -> ShapeCost:
    """A round's cost for ``cell``'s shape from rounds ``timed`` (round, seconds): their median; where they trained
    different local epochs, the least-squares line ``fixed + per_epoch x epochs`` through them. No start."""
    assert cell.config is not None
    seconds = [wall for _, wall in timed]
    epochs = epoch_schedule(cell, (t for t, _ in timed))
    if len(set(epochs)) > 1:
        per_epoch, fixed = statistics.linear_regression(epochs, seconds)
        if per_epoch > 0:
            return ShapeCost(fixed, 0.0, f"{note}, {per_epoch:.1f} s per local epoch", epoch_s=per_epoch)
    elif len(set(epoch_schedule(cell, range(cell.config.train.rounds)))) > 1:
        note = f"{note}; its epochs grow by round, timed at one count: a lower bound"
    return ShapeCost(statistics.median(seconds), 0.0, note)


def _shape(cell: Cell) -> tuple[str, str]:
    return cell.row.key, cell.column.key


def shape_costs(
    cells: Sequence[Cell], *, calibrate: Callable[[Cell], ShapeCost] | None = None
) -> dict[tuple[str, str], ShapeCost | str]:
    """Each runnable shape's cost, from its runs under ``OUT/runs`` or by ``calibrate`` (default :func:`calibrate`);
    a shape that cannot be measured maps to the reason (its data missing)."""
    calibrate = calibrate or calibrate_cell
    costs: dict[tuple[str, str], ShapeCost | str] = {}
    by_shape: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        if cell.config is not None:
            by_shape.setdefault(_shape(cell), []).append(cell)
    for shape, members in by_shape.items():
        directories = [c.run_dir for c in members if c.run_dir is not None]
        timed = next(((d, times) for d in directories if (times := round_walls(d))), None)
        if timed:
            recorded = fitted(members[0], timed[1], f"its runs ({len(timed[1])} rounds)")
            costs[shape] = replace(recorded, steps=recorded_steps(timed[0]))
    untimed = [members[0] for shape, members in by_shape.items() if shape not in costs]
    if untimed:
        print(
            f"--plan: timing {len(untimed)} row x column shape{'s' * (len(untimed) > 1)} that no run under --out "
            f"has timed, by {CALIBRATION_ROUNDS} rounds of each here",
            file=sys.stderr,
            flush=True,
        )
    with steps(len(untimed), "--plan: calibrating", "shape") as bar:
        for cell in untimed:
            bar.set_description_str(f"--plan: timing {cell.row.key} x {cell.column.key}")
            cost = costs[_shape(cell)] = _calibrated(cell, calibrate)
            bar.set_postfix({"cost": f"{cost.round_s:.2f} s/round" if isinstance(cost, ShapeCost) else cost[:40]})
            bar.update(1)
    return costs


def _calibrated(cell: Cell, calibrate: Callable[[Cell], ShapeCost]) -> ShapeCost | str:
    """``cell``'s shape costed by ``calibrate``, or why it cannot be (its data missing, the run refused)."""
    try:
        return calibrate(cell)
    except DatasetError as error:
        return f"{DATA_MISSING}: {str(error).splitlines()[0]}"
    except RayfedError as error:
        return f"cannot run: {str(error).splitlines()[0][:160]}"


def calibrate_cell(cell: Cell) -> ShapeCost:
    """Run :data:`CALIBRATION_ROUNDS` rounds of ``cell`` (one more where its rounds 1 and 2 train different
    epochs, so that a round's growth with its epochs is timed) in a temporary folder, with its checkpoints and
    files: a round's cost comes from the wall times between the ends of the later rounds (:func:`fitted`); the
    start is what the first round took beyond it (data, partition, workers, warm-up)."""
    from rayfed.engine import run

    assert cell.config is not None
    rounds = CALIBRATION_ROUNDS + (len(set(epoch_schedule(cell, (1, 2)))) > 1)
    stamps = _RoundEnds()
    with tempfile.TemporaryDirectory(prefix="rayfed-plan-") as folder:
        overrides = {"train.rounds": rounds, "run_dir": str(Path(folder) / "run"), "engine.loggers": []}
        stamps.started = time.perf_counter()
        run(cell.config.override(overrides), callbacks=[stamps])
    ends = [stamps.started, *stamps.ends]
    gaps = [later - earlier for earlier, later in zip(ends, ends[1:])]
    timed = list(enumerate(gaps))[1:] or [(0, gaps[0])]
    cost = fitted(cell, timed, f"calibrated here ({len(gaps)} rounds)")
    first = cost.seconds(epoch_schedule(cell, (0,)))
    return replace(cost, start_s=max(gaps[0] - first, 0.0), steps=stamps.steps)


class _RoundEnds(Callback):
    """When each round of a run ended, its files and checkpoint written."""

    def __init__(self) -> None:
        self.started = 0.0
        self.ends: list[float] = []
        self.steps: tuple[int, ...] = ()
        """The local steps of each client trained in the last round."""

    def after_round(self, run: RunView, record: RoundRecord, clients: pa.Table) -> bool:
        self.ends.append(time.perf_counter())
        self.steps = _trained_steps(clients) if "steps" in clients.column_names else ()
        return False


def cell_costs(cells: Sequence[Cell], costs: dict[tuple[str, str], ShapeCost | str], rounds: int) -> list[CellCost]:
    """Each runnable cell's seconds to reach ``rounds``, from the rounds its directory holds."""
    out = []
    for cell in cells:
        if cell.config is None:
            continue
        done = rounds_recorded(cell.run_dir)
        cost = costs.get(_shape(cell))
        seconds = None
        if isinstance(cost, ShapeCost):
            left = epoch_schedule(cell, range(done, rounds))
            seconds = cost.seconds(left) + (cost.start_s if left else 0.0)
        out.append(CellCost(cell, done, seconds))
    return out


def run_slots(parallel: int, gpus_per_run: float) -> int:
    """Runs at once: ``parallel``, at most this machine's CPUs and, on GPU shares, its GPUs / share."""
    slots = min(parallel, os.cpu_count() or 1)
    if gpus_per_run > 0:
        import torch

        slots = min(slots, max(int(torch.cuda.device_count() / gpus_per_run), 1))
    return max(slots, 1)


def wall_seconds(seconds: Sequence[float], slots: int) -> float:
    """The time ``seconds`` of work take on ``slots`` runners, longest first, each to the runner free soonest."""
    free = [0.0] * slots
    for cost in sorted(seconds, reverse=True):
        heapq.heapreplace(free, free[0] + cost)
    return max(free, default=0.0)


def _missing_data(cells: Sequence[Cell], costs: dict[tuple[str, str], ShapeCost | str]) -> list[str]:
    """Each dataset whose files are missing, once, with the command that fetches it."""
    missing: dict[str, Cell] = {}
    for cell in cells:
        cost = costs.get(_shape(cell))
        if isinstance(cost, str) and cost.startswith(DATA_MISSING):
            missing.setdefault(cost.removeprefix(f"{DATA_MISSING}: "), cell)
    if not missing:
        return []
    lines = [f"{DATA_MISSING}, so not costed (fetch it, then plan again):"]
    for message, cell in missing.items():
        assert cell.config is not None
        lines += [f"* {message}", f"  fetch: {fetch_command(cell.config)}"]
    return lines


def describe(cost: ShapeCost | str | None) -> str:
    if isinstance(cost, ShapeCost):
        return f"{cost.round_s:.2f} s/round, {cost.note}"
    return cost or "not measured"


def plan_report(
    table: Table,
    cells: Sequence[Cell],
    *,
    rounds: int,
    parallel: int,
    gpus_per_run: float,
    calibrate: Callable[[Cell], ShapeCost] | None = None,
) -> str:
    """The ``--plan`` answer: each cell with its rounds done and seconds left, the total and its wall time here,
    and the same table at the papers' horizon; the last line is ``key=value`` for scripts."""
    costs = shape_costs(cells, calibrate=calibrate)
    per_cell = cell_costs(cells, costs, rounds)
    slots = run_slots(parallel, gpus_per_run)
    lines = [f"{'row':18s} {'column':14s} {'seed':>4s} {'rounds':>9s} {'seconds':>9s}  per round"]
    for item in per_cell:
        cell, left = item.cell, "?" if item.seconds is None else f"{item.seconds:.0f}"
        done = f"{min(item.done, rounds)}/{rounds}"
        cost = costs.get(_shape(cell))
        shown = f"{DATA_MISSING} (below)" if isinstance(cost, str) and cost.startswith(DATA_MISSING) else describe(cost)
        lines.append(f"{cell.row.key:18s} {cell.column.key:14s} {cell.seed:4d} {done:>9s} {left:>9s}  {shown}")
    for cell in cells:
        if cell.config is None:
            lines.append(f"{cell.row.key:18s} {cell.column.key:14s} {cell.seed:4d}  blocked: {cell.blocked}")
    lines += _missing_data(cells, costs)
    known = [item.seconds for item in per_cell if item.seconds is not None]
    to_run = sum(1 for item in per_cell if item.done < rounds)
    work, wall = sum(known), wall_seconds(known, slots)
    unknown = len(per_cell) - len(known)
    lines.append(
        f"to run: {to_run} of {len(per_cell)} cells, {work:,.0f} s of runs, {wall / 3600:.2f} h wall with {slots} "
        f"run{'s' * (slots > 1)} at once" + (f"; {unknown} cells not costed (above)" if unknown else "")
    )
    first_of = {_shape(cell): cell for cell in reversed(cells) if cell.config is not None}
    measured = {shape: cost for shape, cost in costs.items() if isinstance(cost, ShapeCost)}
    one_run = {
        shape: cost.start_s + cost.seconds(epoch_schedule(first_of[shape], range(table.paper_rounds)))
        for shape, cost in measured.items()
    }
    paper = [seconds for seconds in one_run.values() for _ in range(table.paper_seeds)]
    paper_work, paper_wall = sum(paper), wall_seconds(paper, slots)
    if table.paper_rounds:
        lines.append(
            f"the papers' horizon ({table.paper_rounds} rounds, {table.paper_seeds} seeds, {len(paper)} runs of the "
            f"{len(measured)} costed shapes, from scratch): {paper_work / 3600:,.1f} hours of runs (each on one "
            f"CPU, or its GPU share), {paper_wall / 3600:,.1f} h wall with {slots} at once"
        )
    packing, fields = packing_lines(
        cells,
        {shape: cost.steps for shape, cost in measured.items()},
        {shape: seconds / 3600 for shape, seconds in one_run.items()},
        paper_rounds=table.paper_rounds,
        paper_seeds=table.paper_seeds,
    )
    lines += packing
    lines.append(
        f"plan: cells={len(per_cell)} to_run={to_run} work_s={work:.0f} wall_s={wall:.0f} "
        f"paper_run_hours={paper_work / 3600:.1f} paper_wall_hours={paper_wall / 3600:.1f} "
        + " ".join(f"{key}={value:.1f}" for key, value in fields.items())
    )
    return "\n".join(lines)
