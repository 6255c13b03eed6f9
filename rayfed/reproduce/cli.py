"""``rayfed reproduce``: run what a table is missing, then write its Markdown and figures.

rayfed reproduce TABLE [--rounds N] [--seeds K | --seed-list 0,3] [--data-root DIR] [--methods a,b]
                 [--columns x,y] [--parallel P] [--gpus-per-run G] [--at-rounds 1,5,10] [--out DIR]
                 [--set field.path=value ...] [--report-only] [--no-figures] [--plan] [--accept-plugin DIGEST]
rayfed reproduce TABLE --plan ...        what it would run and what that costs here, without running it
rayfed reproduce --list                  the tables, with their rows and columns
rayfed reproduce --list-presets          the papers' protocols (rayfed run --preset NAME)
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayfed.config import parse_override
from rayfed.util.errors import ConfigError
from rayfed.util.plugin_check import accept_plugins

if TYPE_CHECKING:
    from rayfed.reproduce.runner import Cell

__all__ = ["add_reproduce_parser", "reproduce"]


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _share(text: str) -> float:
    """A GPU share: a finite number >= 0."""
    try:
        share = float(text)
    except ValueError:
        share = math.nan
    if not math.isfinite(share) or share < 0:
        raise argparse.ArgumentTypeError(
            f"expected a GPU share >= 0 (0.25: four runs per GPU; 0: on the CPU), got {text!r}"
        ) from None
    return share


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_reproduce_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add the ``reproduce`` subcommand to ``rayfed``'s parser (its handler is set with ``set_defaults``)."""
    p = subparsers.add_parser(
        "reproduce",
        help="run and report one of the papers' tables (resumable)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("table", nargs="?", metavar="TABLE", help="a table name (--list shows them)")
    p.add_argument("--list", action="store_true", help="list the tables and exit")
    p.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    p.add_argument("--rounds", type=int, default=20, help="rounds per run (papers: 300-1000; default 20)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..K-1 (default 3)")
    p.add_argument("--seed-list", type=_ints, help="exact seeds, e.g. 0,3 (instead of --seeds)")
    p.add_argument("--data-root", help="folder with the datasets (torchvision layout); default $RAYFED_DATA")
    p.add_argument("--methods", type=_names, help="row keys, comma-separated (default: all)")
    p.add_argument("--columns", type=_names, help="column keys, comma-separated (default: all)")
    p.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="runs at once: as Ray tasks, or packed into one stack in this process where cells share a model and the "
        "stacked path is on (a GPU share, or engine.vectorize=on); default 1: one after another in this process",
    )
    p.add_argument(
        "--gpus-per-run",
        type=_share,
        default=0.0,
        help="GPU share each run trains on (engine.num_gpus_per_worker; 0.125: eight runs per GPU; default 0: CPU)",
    )
    p.add_argument("--at-rounds", type=_ints, default=[], help="also tabulate the metric at these rounds (0 = init)")
    p.add_argument("--out", type=Path, default=Path("results/reproduce"), help="default results/reproduce")
    p.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a config override for every run (repeatable), e.g. --set data.options.num_samples=3000",
    )
    p.add_argument("--report-only", action="store_true", help="run nothing, only rewrite the report")
    p.add_argument(
        "--plan",
        action="store_true",
        help="run nothing: list the cells, those done, and their cost here and at the papers' horizon (calibrated "
        "by 2 rounds of each row x column no run under --out has timed yet)",
    )
    p.add_argument("--no-figures", action="store_true", help="do not draw the figures")
    p.set_defaults(handler=_handler)
    return p


def _handler(ns: argparse.Namespace) -> int:
    with accept_plugins(*ns.accept_plugin):  # a cell whose run's code changed continues only if told so
        return reproduce(ns, _command(ns))


def _command(ns: argparse.Namespace) -> str:
    """The command line that continues this reproduction (written into the report)."""
    words = ["rayfed", "reproduce", str(ns.table), "--rounds", str(ns.rounds), "--out", str(ns.out)]
    words += ["--seed-list", ",".join(map(str, ns.seed_list))] if ns.seed_list else ["--seeds", str(ns.seeds)]
    for option in ("methods", "columns", "at_rounds"):
        if getattr(ns, option):
            words += [f"--{option.replace('_', '-')}", ",".join(map(str, getattr(ns, option)))]
    if ns.data_root:
        words += ["--data-root", ns.data_root]
    if ns.parallel > 1:
        words += ["--parallel", str(ns.parallel)]
    if ns.gpus_per_run:
        words += ["--gpus-per-run", str(ns.gpus_per_run)]
    for setting in ns.settings:
        words += ["--set", setting]
    return shlex.join(words)


def _listing(presets: bool) -> str:
    if presets:
        from rayfed.config.presets import PRESETS

        return "\n".join(f"{name:22s} {p.summary}" for name, p in PRESETS.items())
    from rayfed.reproduce import TABLES
    from rayfed.reproduce.spec import PAPERS

    lines = ["The papers:", *(f"  {name}: {citation}" for name, citation in PAPERS.items()), ""]
    for t in TABLES.values():
        lines += [
            f"{t.name}: {t.source}: {t.title}",
            f"    methods: {', '.join(r.key for r in t.rows)}",
            f"    columns: {', '.join(c.key for c in t.columns)}",
        ]
    return "\n".join(lines)


def _check_gpus(gpus_per_run: float) -> None:
    """Refuse ``--gpus-per-run`` on a machine without a CUDA GPU (unless the runs go to a Ray cluster, whose
    nodes may have them), before any cell is planned."""
    import torch

    if gpus_per_run > 0 and not torch.cuda.is_available() and not os.environ.get("RAY_ADDRESS"):
        raise ConfigError(
            f"--gpus-per-run {gpus_per_run:g} but this machine has no CUDA GPU; drop --gpus-per-run to train on "
            "the CPU, or run on a machine (or a Ray cluster, RAY_ADDRESS) with GPUs"
        )


def _data_root(ns: argparse.Namespace) -> str | None:
    """``--data-root``, else ``$RAYFED_DATA``; refused (naming which) when it is not a folder."""
    root, named = (ns.data_root, "--data-root") if ns.data_root else (os.environ.get("RAYFED_DATA"), "RAYFED_DATA")
    if root and not Path(root).expanduser().is_dir():
        what = "is not a folder" if Path(root).expanduser().exists() else "does not exist"
        raise ConfigError(
            f"{named}={root!r} {what}; give the folder that holds the datasets (torchvision's layout, e.g. "
            f"ROOT/MNIST/raw), or create it and add --set data.download=true to download them there"
        )
    return root


def _settings(ns: argparse.Namespace) -> dict[str, Any]:
    """What every cell's config overrides: ``--set``'s fields and ``--gpus-per-run``'s share (each run trains on it,
    and its Ray task asks for it); a plugin file that a cell's run was sealed with and that changed since is
    refused before any is imported (:func:`rayfed.reproduce.run_files.check_named_code`)."""
    settings = dict(parse_override(s) for s in ns.settings)
    if "plugins" in settings:
        from rayfed.reproduce.run_files import check_named_code
        from rayfed.util.config_tree import coerce

        check_named_code(Path(ns.out), coerce(tuple[str, ...], settings["plugins"], "--set plugins"))
    if ns.gpus_per_run:
        _check_gpus(ns.gpus_per_run)
        settings = {"engine.num_gpus_per_worker": ns.gpus_per_run, **settings}
    return settings


def _damaged(cells: list[Cell], command: str) -> list[str]:
    """A line for each cell's run directory that cannot be read (``--plan``, ``--report-only``)."""
    from rayfed.reproduce.run_files import damage, damaged_note

    found = {cell.run_dir: damage(cell.run_dir) for cell in cells if cell.run_dir is not None}
    return [damaged_note(directory, reason, command) for directory, reason in found.items() if reason]


def reproduce(ns: argparse.Namespace, command: str = "") -> int:
    """Plan the table's cells, run what is missing (printing each outcome), write the report and figures;
    returns 1 if a cell could not run (its data missing, or it failed) or, with ``--plan`` or ``--report-only``,
    if a run it reads is damaged (each named on stderr; the plain command moves such a run aside), else 0."""
    from rayfed.reproduce import TABLES
    from rayfed.reproduce.packed_runs import execute_packed
    from rayfed.reproduce.report import draw_figures, write_report
    from rayfed.reproduce.runner import Outcome, plan
    from rayfed.util.registry import closest

    if ns.list or ns.list_presets:
        print(_listing(ns.list_presets))
        return 0
    if ns.table not in TABLES:
        hint = closest(str(ns.table), list(TABLES)) if ns.table else ""
        raise ConfigError(f"unknown table {ns.table!r}{hint}; tables: {', '.join(TABLES)} (rayfed reproduce --list)")
    table = TABLES[ns.table]
    for option, known in (("methods", [r.key for r in table.rows]), ("columns", [c.key for c in table.columns])):
        unknown = [k for k in getattr(ns, option) or [] if k not in known]
        if unknown:
            raise ConfigError(
                f"--{option}: {', '.join(unknown)} not in table {table.name}; choose from {', '.join(known)}"
            )
    if ns.rounds < 1 or ns.seeds < 1 or ns.parallel < 1:
        raise ConfigError("--rounds, --seeds and --parallel must be >= 1")
    data_root = _data_root(ns)
    seeds = ns.seed_list if ns.seed_list else list(range(ns.seeds))
    settings = _settings(ns)
    cells = plan(
        table,
        ns.out,
        rounds=ns.rounds,
        seeds=seeds,
        rows=ns.methods,
        columns=ns.columns,
        data_root=data_root,
        settings=settings,
    )
    if ns.plan:
        from rayfed.reproduce.costing import plan_report

        print(f"{table.name}: {table.source}; {ns.rounds} rounds, seeds {seeds}", flush=True)
        print(plan_report(table, cells, rounds=ns.rounds, parallel=ns.parallel, gpus_per_run=ns.gpus_per_run))
        return _say_damaged(_damaged(cells, command or "rayfed reproduce"))
    outcomes = {}
    damaged = _damaged(cells, command or "rayfed reproduce") if ns.report_only else []
    if not ns.report_only:
        start, runnable = time.perf_counter(), sum(1 for c in cells if c.config is not None)
        print(f"{table.name}: {len(cells)} cells ({runnable} runnable), {ns.rounds} rounds, seeds {seeds}", flush=True)

        def done(cell: Cell, outcome: Outcome) -> None:
            print(
                f"[{time.perf_counter() - start:7.0f} s] {cell.row.key} {cell.column.key} seed {cell.seed}: "
                f"{outcome.status} {outcome.message}".rstrip()[:400],
                flush=True,
            )
            write_report(table, cells, ns.out, rounds=ns.rounds, at_rounds=ns.at_rounds, command=command)

        outcomes = execute_packed(cells, parallel=ns.parallel, on_done=done)
    path = write_report(
        table, cells, ns.out, rounds=ns.rounds, at_rounds=ns.at_rounds, outcomes=outcomes, command=command
    )
    print(path.read_text())
    if not ns.no_figures:
        for figure in draw_figures(table, cells, ns.out, rounds=ns.rounds):
            print(figure)
    unfinished = sorted({o.status for o in outcomes.values() if o.status in ("data missing", "failed")})
    if unfinished:
        count = sum(1 for o in outcomes.values() if o.status in unfinished)
        print(
            f"rayfed: error: {count} cell{'s' * (count > 1)} could not run ({', '.join(unfinished)}); the report "
            f"{str(path)!r} lists why and the commands that fetch missing data",
            file=sys.stderr,
        )
        return 1
    return _say_damaged(damaged)


def _say_damaged(lines: list[str]) -> int:
    """Print each damaged run's line; 1 if there was one."""
    for line in lines:
        print(f"rayfed: error: {line}", file=sys.stderr)
    return 1 if lines else 0
