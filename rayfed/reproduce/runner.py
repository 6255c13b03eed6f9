"""Run what a table is missing: one run directory per (row, column, seed), resumed, extended or skipped.

A cell's run directory is named by its config (algorithm, dataset, seed and a digest of every
field that changes results), so a cell shared by two tables, or asked for again, is found and
never run twice: a run with the rounds asked for is skipped, a shorter finished one is extended
(``train.rounds`` may change when a run continues), a stopped one resumes from its last
checkpoint (one is written every round), and a damaged one (a file that cannot be read, a checkpoint torn by a
kill) is moved aside to ``RUN.damaged-<time>``, never deleted, and run again (:mod:`rayfed.reproduce.run_files`).
Cells run one after the other in this process, or
``parallel`` at a time as Ray tasks (one CPU each, plus the run's ``engine.num_gpus_per_worker``:
``--gpus-per-run``), each run on the local backend in its task, so seeds and cells of a table share
the cluster as resources allow: eight runs at 0.125 GPU share one GPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayfed.config import RunConfig
from rayfed.reproduce.run_files import damage, move_aside, rounds_done
from rayfed.reproduce.spec import Column, Row, Table, cell_overrides, unavailable
from rayfed.util.errors import CheckpointError, CheckpointFormatError, ConfigError, DatasetError, RayfedError
from rayfed.util.plugin_check import accept_plugins, accepted_digests
from rayfed.util.plugins import WithCode

__all__ = ["Cell", "Outcome", "plan", "run_cell", "execute", "fetch_command"]


@dataclass(frozen=True, eq=False)
class Cell:
    """One (row, column, seed) of a table: its config, or why it cannot run."""

    row: Row
    column: Column
    seed: int
    config: RunConfig | None
    """The config to run (rounds as asked); None when ``blocked``."""
    blocked: str = ""
    """Why the cell cannot run in this version ("" = it can)."""

    @property
    def run_dir(self) -> Path | None:
        return None if self.config is None else Path(str(self.config.run_dir))


@dataclass
class Outcome:
    """What running (or skipping) one cell did."""

    status: str
    """skipped, ran, resumed, extended, data missing, failed."""
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)


_LATER_FIELDS: tuple[tuple[str, tuple[str, ...], Any], ...] = (
    ("", ("model", "init"), "derived"),
    ("cfl", ("algorithm", "params", "norms"), "update"),
    ("fedfomo", ("algorithm", "params", "fidelity"), "paper"),
)
"""(algorithm or "" for any, field, default) of fields added after runs were first named: left out of the digest
while they hold their default, so that a run made before keeps its name (its numbers are those of the default)."""
_RENAMED_VALUES: dict[tuple[str, tuple[str, ...], str], str] = {
    ("ktpfl", ("algorithm", "params", "fidelity"), "corrected"): "code",
    ("ktpfl", ("algorithm", "params", "fidelity"), "code"): "code as written",
}
"""(algorithm, field, value) -> the value the digest takes: a value renamed after runs were first named keeps
their names (KT-pFL's ``corrected`` was called ``code``), and a name given to new behaviour gets names of its own."""


def run_dir_name(config: RunConfig) -> str:
    """``<algorithm>-<dataset>-s<seed>-<digest>``: the same name for the same results-defining config.

    Left out of the digest: what does not change a run's numbers (``engine.*`` but ``engine.eval_local``, which
    adds columns, ``run_dir``, ``plugins``, where the data live), ``train.rounds``, so a run asked for more rounds
    is the same run, extended, the ``system`` and ``privacy`` sections while they are off, and the fields of
    :data:`_LATER_FIELDS` at their defaults; values renamed since runs were first named enter it under
    :data:`_RENAMED_VALUES`.
    """
    plain = {k: v for k, v in config.to_dict().items() if k not in ("engine", "run_dir", "plugins")}
    plain["train"] = {k: v for k, v in plain["train"].items() if k != "rounds"}
    plain["data"] = {k: v for k, v in plain["data"].items() if k not in ("root", "download")}
    if config.engine.eval_local:
        plain["eval_local"] = True
    if not config.system.enabled:  # off, the system section changes no number (docs/system.md)
        plain.pop("system", None)
    if not config.privacy.enabled:  # off, the privacy section changes no number (docs/privacy.md)
        plain.pop("privacy", None)
    algorithm = config.algorithm.name
    for owner, path, default in _LATER_FIELDS:
        parent = _parent(plain, path)
        if owner in ("", algorithm) and parent.get(path[-1], default) == default:
            parent.pop(path[-1], None)
    for path in dict.fromkeys(path for owner, path, _ in _RENAMED_VALUES if owner == algorithm):
        parent = _parent(plain, path)
        if path[-1] in parent:
            parent[path[-1]] = _RENAMED_VALUES.get((algorithm, path, parent[path[-1]]), parent[path[-1]])
    digest = hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{config.algorithm.name}-{config.data.dataset}-s{config.seed}-{digest}"


def _parent(plain: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """The dict that holds ``path[-1]`` in the nested ``plain`` (an empty one where the path does not lead)."""
    node: Any = plain
    for key in path[:-1]:
        node = node.get(key, {}) if isinstance(node, dict) else {}
    return node if isinstance(node, dict) else {}


def plan(
    table: Table,
    out: Path,
    *,
    rounds: int,
    seeds: Sequence[int],
    rows: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
    data_root: str | None = None,
    settings: dict[str, Any] | None = None,
) -> list[Cell]:
    """Every cell of ``table`` (the rows and columns chosen, each seed) with its config under ``out/runs``.

    ``settings`` (dotted paths) apply to every cell last, e.g. a smaller dataset in tests or
    ``engine.num_gpus_per_worker`` (the GPU share each run trains on, and asks its task for). A cell
    whose algorithm, dataset or model is not registered, or whose config is refused, is kept with
    the reason in ``blocked``.
    """
    out = Path(out).absolute()  # Ray tasks may start in another folder
    chosen_rows = [table.row(k) for k in rows] if rows else list(table.rows)
    chosen_cols = [table.column(k) for k in columns] if columns else list(table.columns)
    cells = []
    for column in chosen_cols:
        for row in chosen_rows:
            base = {**cell_overrides(table, row, column), **(settings or {})}
            reason = unavailable(base)
            for seed in seeds:
                if reason:
                    cells.append(Cell(row, column, seed, None, reason))
                    continue
                values = {
                    **base,
                    "seed": seed,
                    "train.rounds": rounds,
                    "engine.backend": "local",
                    "engine.progress": False,
                    "engine.checkpoint_every": 1,
                }
                if data_root is not None:
                    values["data.root"] = str(Path(data_root).expanduser().absolute())
                try:
                    config = RunConfig().override(values)
                except ConfigError as error:
                    cells.append(Cell(row, column, seed, None, f"config refused: {error}"))
                    continue
                config = config.override({"run_dir": str(out / "runs" / run_dir_name(config))})
                cells.append(Cell(row, column, seed, config))
    return cells


def _run_shipped(shipped: WithCode, accepted: Sequence[str]) -> Outcome:
    """:func:`run_cell` as a Ray task runs it: its config received with its code beside it
    (:mod:`rayfed.util.plugins`)."""
    return run_cell(shipped.config, accepted)


def run_cell(config: RunConfig, accepted: Sequence[str]) -> Outcome:
    """Bring one run to its ``train.rounds``: skip, run, resume or extend it (a plain function, which a Ray task
    runs through :func:`_run_shipped`), accepting changed plugin files of
    these digests (:func:`rayfed.util.plugin_check.accept_plugins`; ``rayfed reproduce --accept-plugin``).

    A missing dataset is an outcome ("data missing", the loader's message), not an exception,
    so one missing column does not stop the others; so is any other refusal ("failed"). A damaged run
    directory is moved aside and the cell run again; the outcome's message says where it went.
    """
    from rayfed.tracking import run

    directory = Path(str(config.run_dir))
    reason = damage(directory)
    moved = _set_aside(directory, reason) if reason else ""
    done = rounds_done(directory)
    if done >= config.train.rounds:
        return Outcome("skipped", f"has {done} rounds")
    resume = (directory / "config.json").is_file()
    try:
        try:
            with accept_plugins(*accepted):
                result = run(config, resume=resume)
        except CheckpointFormatError:  # written by another rayfed version: keep it, say so
            raise
        except CheckpointError as error:  # a checkpoint torn by a kill, a damaged file: set aside, run again
            moved = _set_aside(directory, str(error).split("; ")[0])
            result = run(config)
            done, resume = 0, False
    except DatasetError as error:
        return Outcome("data missing", f"{moved}{error}")
    except RayfedError as error:
        return Outcome("failed", f"{moved}{error}")
    status = "extended" if done else ("resumed" if resume else "ran")
    return Outcome(status, f"{moved}{result.rounds_run} rounds, best {100 * result.best_accuracy:.2f}")


def _set_aside(directory: Path, reason: str) -> str:
    """Move a damaged run directory aside (:func:`~rayfed.reproduce.run_files.move_aside`); say where, and why."""
    target = move_aside(directory)
    return f"moved the damaged run aside to {target} ({reason}), and ran the cell again from round 0; "


def fetch_command(config: RunConfig) -> str:
    """The command that downloads a cell's dataset into its ``data.root`` (torchvision), to print beside it."""
    root = config.data.root or "<data folder>"
    name = json.dumps(config.data.dataset)
    code = f"from rayfed.data import load_dataset; load_dataset({name}, {json.dumps(root)}, download=True)"
    return f"python -c {shlex.quote(code)}"


def execute(
    cells: Sequence[Cell],
    *,
    parallel: int = 1,
    on_done: Callable[[Cell, Outcome], None] = lambda cell, outcome: None,
) -> dict[Cell, Outcome]:
    """Run every runnable cell; ``on_done`` sees each outcome as it comes (to rewrite the report).

    Sequentially, a column whose data turned out missing is not tried again for its other cells.
    """
    runnable = [c for c in cells if c.config is not None]
    outcomes: dict[Cell, Outcome] = {}
    if parallel <= 1 or len(runnable) <= 1:
        missing: dict[str, Outcome] = {}
        for cell in runnable:
            assert cell.config is not None
            key = f"{cell.config.data.dataset}:{cell.config.data.root}"
            outcome = missing.get(key) or run_cell(cell.config, accepted_digests())
            if outcome.status == "data missing":
                missing[key] = outcome
            outcomes[cell] = outcome
            on_done(cell, outcome)
        return outcomes
    return _execute_on_ray(runnable, parallel, on_done)


def _execute_on_ray(cells: list[Cell], parallel: int, on_done: Callable[[Cell, Outcome], None]) -> dict[Cell, Outcome]:
    """At most ``parallel`` cells at a time as Ray tasks on the cluster of ``RAY_ADDRESS``, or on a private
    local Ray (:func:`rayfed.actors.cluster.ray_started`: without token authentication, shut down after).
    Each task asks for one CPU and its run's GPU share (``engine.num_gpus_per_worker``)."""
    import ray

    from rayfed.actors.cluster import ray_started

    address = os.environ.get("RAY_ADDRESS")
    task = ray.remote(num_cpus=1, max_retries=0)(_run_shipped)
    outcomes: dict[Cell, Outcome] = {}
    pending: dict[Any, Cell] = {}
    queue = list(cells)
    private: dict[str, Any] = {} if address else {"num_cpus": parallel, "include_dashboard": False}
    with ray_started(address, **private):
        while queue or pending:
            while queue and len(pending) < parallel:
                cell = queue.pop(0)
                assert cell.config is not None
                share = cell.config.engine.num_gpus_per_worker
                pending[task.options(num_gpus=share).remote(WithCode(cell.config), accepted_digests())] = cell
            ready, _ = ray.wait(list(pending), num_returns=1)
            cell = pending.pop(ready[0])
            try:
                outcome = ray.get(ready[0])
            except Exception as error:  # noqa: BLE001  (a task that died: report it with the cell)
                outcome = Outcome("failed", f"{type(error).__name__}: {error}")
            outcomes[cell] = outcome
            on_done(cell, outcome)
    return outcomes
