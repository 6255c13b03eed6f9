"""``rayfed reproduce --parallel P``: the cells that may share one stack train packed, through ``rayfed.run_many``.

The runnable cells are grouped by :func:`~rayfed.execution.run_packs.pack_runs` (the seeds of a row and column, and
rows of one method that differ in floats only, where the stacked path is on: a GPU share, or
``engine.vectorize=on``); each pack trains in this process, at most ``P`` runs at once, as lanes of one stack
(``rayfed.run_many``). Every other cell runs as before, one run a Ray task (:func:`~rayfed.reproduce.runner.execute`),
and the log says in one line which cells pack and which train alone, and why. On a CPU with the defaults nothing
packs, so the reproduction runs as fast as before.

Packing never changes a number and is never an error: a cell whose pack raised (one of its runs failed, its data
is missing, a checkpoint torn) is brought to its rounds alone by :func:`~rayfed.reproduce.runner.run_cell`, from the
checkpoint it wrote every round, which also says what went wrong in that cell's words.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from rayfed.execution.run_packs import pack_runs
from rayfed.reproduce.packed_cost import cells_line
from rayfed.reproduce.run_files import damage, rounds_done
from rayfed.reproduce.runner import Cell, Outcome, execute, run_cell
from rayfed.util.plugin_check import accept_plugins, accepted_digests

logger = logging.getLogger(__name__)

__all__ = ["split_packs", "run_pack", "execute_packed"]


def split_packs(cells: Sequence[Cell], parallel: int) -> tuple[list[list[Cell]], list[Cell], str]:
    """The packs of at most ``parallel`` runnable cells that train together (none with ``parallel`` 1), the cells
    that run alone, and the line that says which and why."""
    runnable = [cell for cell in cells if cell.config is not None]
    if parallel <= 1:
        return [], runnable, ""
    packs = pack_runs([cell.config for cell in runnable if cell.config is not None])
    chunks = [
        [runnable[i] for i in pack[start : start + parallel]]
        for pack in packs.packs
        for start in range(0, len(pack), parallel)
    ]
    together = [chunk for chunk in chunks if len(chunk) > 1]
    packed = {id(cell) for chunk in together for cell in chunk}
    return together, [cell for cell in runnable if id(cell) not in packed], cells_line(runnable, packs)


def run_pack(cells: Sequence[Cell], accepted: Sequence[str]) -> dict[Cell, Outcome]:
    """Bring ``cells`` to their rounds, those to run (new, or resumed and extended: two packs) as lanes of one stack;
    a cell already done is skipped, a damaged one and every cell of a pack that raised run alone (module
    docstring)."""
    from rayfed.packs import run_many

    outcomes: dict[Cell, Outcome] = {}
    by_resume: dict[bool, list[tuple[Cell, int]]] = {False: [], True: []}
    alone: list[Cell] = []
    for cell in cells:
        assert cell.run_dir is not None and cell.config is not None
        if damage(cell.run_dir):
            alone.append(cell)  # run_cell moves it aside and says where
            continue
        done = rounds_done(cell.run_dir)
        if done >= cell.config.train.rounds:
            outcomes[cell] = Outcome("skipped", f"has {done} rounds")
        else:
            by_resume[(cell.run_dir / "config.json").is_file()].append((cell, done))
    for resume, members in by_resume.items():
        if len(members) < 2:
            alone += [cell for cell, _ in members]
            continue
        try:
            with accept_plugins(*accepted):
                results = run_many([cell.config for cell, _ in members if cell.config is not None], resume=resume)
        except Exception as error:  # noqa: BLE001 - each cell is brought to its rounds alone, which names its error
            logger.warning("a pack of %d cells raised (%s); each is brought to its rounds alone", len(members), error)
            alone += [cell for cell, _ in members]
            continue
        for (cell, done), result in zip(members, results, strict=True):
            status = "extended" if done else ("resumed" if resume else "ran")
            best = 100 * result.best_accuracy
            outcomes[cell] = Outcome(status, f"{result.rounds_run} rounds, best {best:.2f}, packed with {len(members)}")
    for cell in alone:
        assert cell.config is not None
        outcomes[cell] = run_cell(cell.config, accepted)
    return outcomes


def execute_packed(
    cells: Sequence[Cell], *, parallel: int = 1, on_done: Callable[[Cell, Outcome], None] = lambda cell, o: None
) -> dict[Cell, Outcome]:
    """Run every runnable cell: the packs first, in this process, then the others as
    :func:`~rayfed.reproduce.runner.execute` runs them; ``on_done`` sees each outcome as it comes."""
    packs, others, line = split_packs(cells, parallel)
    if line:
        print(f"packs: {line}", flush=True)
    outcomes: dict[Cell, Outcome] = {}
    for pack in packs:
        for cell, outcome in run_pack(pack, accepted_digests()).items():
            outcomes[cell] = outcome
            on_done(cell, outcome)
    outcomes.update(execute(others, parallel=parallel, on_done=on_done))
    return outcomes
