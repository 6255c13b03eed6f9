"""The ``rayfed`` command line.

    rayfed run [CONFIG] [field.path=value ...]     run a config file (TOML/YAML/JSON) with overrides
    rayfed run --resume RUN_DIR [field=value ...]  resume a run from its last checkpoint
    rayfed list [ALGORITHM]                        registered algorithms, datasets and models, or
                                                   one algorithm's params (default, allowed values, meaning)
    rayfed plot RUN_DIR [RUN_DIR ...] --out DIR    figures (PNG) from finished runs
    rayfed run --preset NAME [field=value ...]     start from a paper's protocol (rayfed.config.presets)
    rayfed reproduce TABLE [--rounds N ...]        run and report one of the papers' tables (rayfed.reproduce)
    rayfed check METHOD [field.path=value ...]     run a method two rounds on tiny data, stacked and one client
                                                   at a time, and say whether it stacks, with equal losses
    rayfed privacy [CONFIG] [field=value ...] [--target-epsilon E]
                                                   a run's epsilon, or the noise multiplier a target needs

Examples::

    rayfed run configs/mnist_practical.toml train.rounds=50 data.root=~/data
    rayfed run algorithm.name=fedprox algorithm.params.mu=0.01 engine.num_workers=2
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rayfed.config import field_reference
from rayfed.config.args import config_from_args
from rayfed.engine.interrupts import (
    RunInterrupted,
    StudyInterrupted,
    exit_status,
    how_stopped,
    terminate_as_interrupt,
)
from rayfed.util.errors import ConfigError, RayfedError

if TYPE_CHECKING:  # the CLI imports the engine when it runs
    from rayfed.engine.result import RunResult

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rayfed", description="Simulate personalized federated learning on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run (or resume) a simulation",
        description="Run (or resume) a simulation. A config file (TOML, YAML, JSON) names fields by tables or by\n"
        "flat dotted keys (train.lr = 0.02); every field can also be set here as field.path=value.",
        epilog=f"config fields (path = default):\n\n{field_reference()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("args", nargs="*", help="an optional config file, then field.path=value overrides")
    run.add_argument("--resume", metavar="RUN_DIR", help="resume the run in RUN_DIR from its last checkpoint")
    run.add_argument("--quiet", action="store_true", help="no progress bar, warnings only")
    run.add_argument("--preset", metavar="NAME", help="start from a paper's protocol (rayfed reproduce --list-presets)")
    add_accept_option(run)
    listing = sub.add_parser("list", help="list registered algorithms, datasets and models, or one algorithm's params")
    listing.add_argument("algorithm", nargs="?", metavar="ALGORITHM", help="show this algorithm's algorithm.params.*")
    plot = sub.add_parser("plot", help="draw figures (accuracy curves, p vs p-tilde, row norms) from finished runs")
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories; their curves share one plot")
    plot.add_argument("--out", required=True, metavar="DIR", help="folder for the PNG files")
    plot.set_defaults(handler=_plot)
    checking = sub.add_parser(
        "check",
        help="run a method two rounds on tiny data, stacked and one client at a time, and report its mistakes",
        description="Run a method for two rounds on tiny synthetic data, stacked (engine.vectorize=on) and one client "
        "at a time, on the CPU; say whether it stacks, whether both give equal losses, its upload and message sizes, "
        "and every mistake with its fix. Exit status 1 if it does not stack, differs or has a mistake.",
    )
    checking.add_argument("method", metavar="METHOD", help="a registered algorithm, or a .py file that registers some")
    checking.add_argument("overrides", nargs="*", help="field.path=value on top of the tiny run (model.name=...)")
    checking.add_argument("--rounds", type=int, default=2, help="rounds to run (default 2)")
    checking.add_argument("--clients", type=int, default=8, help="clients, all trained in every round (default 8)")
    checking.set_defaults(handler=_check)
    privacy = sub.add_parser(
        "privacy",
        help="say a run's epsilon after train.rounds rounds, or the noise multiplier a target epsilon needs",
        description="The accountant's answer for a run's config (docs/privacy.md), without running it: epsilon at "
        "privacy.delta after train.rounds rounds, or with --target-epsilon the smallest privacy.noise_multiplier "
        "that meets it over those rounds.",
    )
    privacy.add_argument("args", nargs="*", help="an optional config file, then field.path=value overrides")
    privacy.add_argument("--target-epsilon", type=float, metavar="E", help="the epsilon the run may spend")
    privacy.set_defaults(handler=_privacy)
    _add_tune_parser(sub)
    from rayfed.reproduce.cli import add_reproduce_parser

    add_accept_option(add_reproduce_parser(sub))
    return parser


def _add_tune_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    try:
        from rayfed.tuning.cli import add_tune_parser
    except ImportError:  # the tuning package is optional at import time
        return
    add_accept_option(add_tune_parser(sub))


def add_accept_option(parser: argparse.ArgumentParser) -> None:
    """The ``--accept-plugin DIGEST`` option of the commands that continue runs (their handlers wrap the work in
    :func:`accept_plugins`)."""
    parser.add_argument(
        "--accept-plugin",
        action="append",
        default=[],
        metavar="DIGEST",
        help="continue a run whose plugin or trace file changed: accept the file of this sha256 (the digits its "
        "refusal names); recorded in the run's marker",
    )


def _list(algorithm: str | None) -> None:
    """The registries; with ``algorithm``, that algorithm's params (an unknown name: ConfigError, did you mean).

    Read through :mod:`rayfed.config.catalogue`, which imports torch only when the package changed.
    """
    from rayfed.config.catalogue import catalogue

    listing = catalogue()
    if algorithm is not None:
        if algorithm not in listing.params:
            from rayfed.algorithms import ALGORITHMS

            ALGORITHMS.get(algorithm)  # raises the registry's error, with its "did you mean"
        print(listing.params[algorithm])
        return
    print("algorithms (fast path: stacked clients, steps replayed from CUDA graphs; rayfed list NAME says why not):")
    for name, summary in listing.algorithms.items():
        print(f"  {name:16s} {listing.fast_path[name]:16s} {summary}")
    print("datasets:  ", ", ".join(listing.datasets))
    print("models:    ", ", ".join(listing.models))


def _plot(ns: argparse.Namespace) -> int:
    from rayfed.results.plots import write_figures

    paths, notes = write_figures(ns.run_dirs, ns.out)
    for note in notes:
        print(f"note: {note}")
    for path in paths:
        print(path)
    return 0


def _check(ns: argparse.Namespace) -> int:
    from rayfed.checking.method_check import check, methods_in
    from rayfed.config import parse_override

    overrides = dict(parse_override(arg) for arg in ns.overrides)
    methods = [ns.method]
    if ns.method.endswith(".py"):
        methods = methods_in(ns.method)
        overrides.setdefault("plugins", [ns.method])
    reports = [check(method, overrides, rounds=ns.rounds, clients=ns.clients) for method in methods]
    print("\n".join(str(report) for report in reports))
    return 0 if all(report.ok for report in reports) else 1


def _privacy(ns: argparse.Namespace) -> int:
    from rayfed.engine.privacy_records import run_accounting

    config = config_from_args(ns.args, None)
    if not config.privacy.enabled:
        config = config.override({"privacy.mechanism": "central"})
    accounting = run_accounting(config)
    assert accounting is not None
    p, rounds = config.privacy, config.train.rounds
    print(
        f"{p.mechanism} DP, {accounting.described}, {rounds} {accounting.per}s, accountant {p.accountant}, "
        f"delta {p.delta:g}"
    )
    if ns.target_epsilon is None:
        print(f"epsilon {accounting.epsilon(rounds):.6g} with privacy.noise_multiplier={p.noise_multiplier:g}")
    else:
        z = accounting.noise_for(ns.target_epsilon, rounds)
        print(f"privacy.noise_multiplier={z:.6g} gives epsilon {ns.target_epsilon:g} after {rounds} rounds")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in ``argv``; returns the exit status: 1 when no round of a run produced a finite
    training loss, 2 for bad input, 130 when Ctrl-C stopped it and 143 when SIGTERM did (it stops a run as
    Ctrl-C does: :mod:`rayfed.engine.interrupts`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        with terminate_as_interrupt():
            if ns.command == "list":
                _list(ns.algorithm)
                return 0
            if ns.command == "run":
                return _run(ns)
            return int(ns.handler(ns))  # subcommands added by extensions (rayfed tune)
    except RayfedError as e:
        print(f"rayfed: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # one line instead of a traceback (rayfed.engine.interrupts)
        print(_interrupted(e, ns.command, shlex.join(["rayfed", *argv])))
        return exit_status(e)
    except BrokenPipeError:  # the reader of stdout left (rayfed list | head): stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 141


def _run(ns: argparse.Namespace) -> int:
    from rayfed.util.plugin_check import accept_plugins

    with accept_plugins(*ns.accept_plugin):
        if ns.resume is None:
            config = config_from_args(ns.args, ns.preset)  # bad arguments: refused before torch loads
        elif ns.preset is not None:
            raise ConfigError(f"--preset {ns.preset!r} cannot be combined with --resume {ns.resume!r}: give one base")
        else:
            from rayfed.provenance.resume_config import resumed_config

            config = resumed_config(ns.resume, ns.args)  # the run's seal checked before its code is imported
        from rayfed.tracking import run

        if ns.quiet:
            config = config.override({"engine.progress": False})
        else:
            logging.getLogger("rayfed").setLevel(logging.INFO)
        result = run(config, resume=ns.resume is not None)
    untrained = result.rounds_without_loss
    note = f" ({len(untrained)} without a finite training loss: {_rounds(untrained)})" if untrained else ""
    print(
        f"done: {result.rounds_run} rounds{note}, best accuracy {result.best_accuracy:.4f}, "
        f"final {result.final_accuracy:.4f}{_virtual_time(result)}, results in {result.run_dir}"
    )
    if result.trained:
        return 0
    from rayfed.engine.simulation import untrained_cause

    if result.unreported:  # a system model that kept every client's work from the server
        print(f"rayfed: error: {result.unreported}", file=sys.stderr)
        return 1
    print(
        f"rayfed: error: no round produced a finite training loss (every client update was rejected as NaN or "
        f"infinite, or beyond engine.max_update_norm), so the models never changed; "
        f"{untrained_cause(config, non_finite=config.engine.max_update_norm is None)}",
        file=sys.stderr,
    )
    return 1


def _virtual_time(result: RunResult) -> str:
    """With a system model, the run's virtual time and, with ``system.target_accuracy``, its time to the target
    (``summary.json``'s, docs/system.md); "" without one."""
    from rayfed.scheduling.system_records import system_summary

    summary = system_summary(result.history, result.config.system)
    if not summary:
        return ""
    note = f", virtual time {summary['virtual_time_s']:.1f} s"
    if "target_accuracy" not in summary:
        return note
    if summary["virtual_time_to_target_s"] is None:
        return f"{note} (accuracy {summary['target_accuracy']:g} not reached)"
    return (
        f"{note} (accuracy {summary['target_accuracy']:g} at {summary['virtual_time_to_target_s']:.1f} s, "
        f"round {summary['rounds_to_target']})"
    )


def _rounds(rounds: Sequence[int], shown: int = 5) -> str:
    return "rounds " + ", ".join(map(str, rounds[:shown])) + (", ..." if len(rounds) > shown else "")


def _interrupted(error: KeyboardInterrupt, subcommand: str, command: str) -> str:
    """What Ctrl-C (or SIGTERM) left and the exact command that continues: a run's own line, or the same
    command again."""
    if isinstance(error, (RunInterrupted, StudyInterrupted)):
        return str(error) if isinstance(error, RunInterrupted) else f"{error}; resume it with: {command}"
    stopped = how_stopped(error)
    if subcommand == "reproduce":
        return f"{stopped}; finished runs are kept and stopped ones resume from their last round: {command}"
    return f"{stopped} before the first round finished; start again with: {command}"
