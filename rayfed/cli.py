"""The ``rayfed`` command line.

    rayfed run [CONFIG] [field.path=value ...]     run a config file (TOML/YAML/JSON) with overrides
    rayfed run --resume RUN_DIR [field=value ...]  resume a run from its last checkpoint
    rayfed list                                    registered algorithms, datasets and models
    rayfed plot RUN_DIR [RUN_DIR ...] --out DIR    figures (PNG) from finished runs

Examples::

    rayfed run configs/mnist_fedavg.toml train.rounds=50 data.root=~/data
    rayfed run algorithm.name=fedprox algorithm.params.mu=0.01 engine.num_workers=2
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from rayfed.cli_args import config_from_args
from rayfed.errors import RayfedError

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rayfed", description="Simulate personalized federated learning on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or resume) a simulation")
    run.add_argument("args", nargs="*", help="an optional config file, then field.path=value overrides")
    run.add_argument("--resume", metavar="RUN_DIR", help="resume the run in RUN_DIR from its last checkpoint")
    run.add_argument("--quiet", action="store_true", help="no progress bar, warnings only")
    sub.add_parser("list", help="list registered algorithms, datasets and models")
    plot = sub.add_parser("plot", help="draw figures (accuracy curves, p vs p-tilde, row norms) from finished runs")
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories; their curves share one plot")
    plot.add_argument("--out", required=True, metavar="DIR", help="folder for the PNG files")
    plot.set_defaults(handler=_plot)
    _add_tune_parser(sub)
    return parser


def _add_tune_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    try:
        from rayfed.tuning.cli import add_tune_parser
    except ImportError:  # the tuning package is optional at import time
        return
    add_tune_parser(sub)


def _list() -> None:
    from rayfed.algorithms import ALGORITHMS
    from rayfed.data import DATASETS
    from rayfed.models import MODELS

    print("algorithms:")
    for name in ALGORITHMS:
        print(f"  {name:16s} {ALGORITHMS.get(name).summary}")
    print("datasets:  ", ", ".join(DATASETS.names()))
    print("models:    ", ", ".join(MODELS.names()))


def _plot(ns: argparse.Namespace) -> int:
    from rayfed.plots import write_figures

    paths, notes = write_figures(ns.run_dirs, ns.out)
    for note in notes:
        print(f"note: {note}")
    for path in paths:
        print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if ns.command == "list":
            _list()
            return 0
        if ns.command == "run":
            from rayfed.engine import run

            config = config_from_args(ns.args, ns.resume)
            if ns.quiet:
                config = config.override({"engine.progress": False})
            else:
                logging.getLogger("rayfed").setLevel(logging.INFO)
            result = run(config, resume=ns.resume is not None)
            print(
                f"done: {result.rounds_run} rounds, best accuracy {result.best_accuracy:.4f}, "
                f"final {result.final_accuracy:.4f}, results in {result.run_dir}"
            )
            return 0
        return ns.handler(ns)  # subcommands added by extensions (rayfed tune)
    except RayfedError as e:
        print(f"rayfed: error: {e}", file=sys.stderr)
        return 2
