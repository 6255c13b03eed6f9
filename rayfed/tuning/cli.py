"""``rayfed tune``: run or resume a study from a search-space file.

    rayfed tune SPACE_FILE [CONFIG_FILE] [field.path=value ...] --trials N --parallel K
                [--study-name NAME] [--study-dir DIR] [--storage URL]
                [--pruner median|successive_halving|hyperband|none] [--pruner-warmup ROUNDS]
                [--objective best|final]
                [--sampler tpe|random] [--seed N] [--accept-plugin DIGEST]

Example::

    rayfed tune examples/space.yaml configs/mnist_practical.toml data.root=~/data train.rounds=50 \\
        --trials 40 --parallel 2 --study-name lambda

Running the same command again resumes the study from its storage. Each trial prints a line per
round and one when it ends (:mod:`rayfed.tuning.progress`); the best trials are printed at the end
and plots are written to the study directory.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rayfed.util.plugin_check import accept_plugins

__all__ = ["add_tune_parser"]


def add_tune_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add the ``tune`` subcommand to ``rayfed``'s parser (its handler is set with ``set_defaults``)."""
    tune = subparsers.add_parser("tune", help="search hyper-parameters with Optuna (resumable)")
    tune.add_argument("space", metavar="SPACE_FILE", help="search space file (YAML, TOML, JSON): path -> distribution")
    tune.add_argument("args", nargs="*", help="an optional config file, then field.path=value overrides of the base")
    tune.add_argument("--trials", type=int, default=20, metavar="N", help="finished trials wanted (default 20)")
    tune.add_argument("--parallel", type=int, default=1, metavar="K", help="trials at once (default 1)")
    tune.add_argument("--study-name", help="name in the storage (default: the space file's name)")
    tune.add_argument("--study-dir", help="folder for the trials' run directories (default runs/tune/NAME)")
    tune.add_argument("--storage", help="Optuna storage URL, or journal:///path/file.log (default: STUDY_DIR/study.db)")
    tune.add_argument(  # the names of rayfed.tuning.pruning.PRUNERS, which imports Optuna; checked when tuning starts
        "--pruner", default="median", metavar="NAME", help="median (default), successive_halving, hyperband or none"
    )
    tune.add_argument(
        "--pruner-warmup",
        type=int,
        metavar="ROUNDS",
        help="rounds each trial trains before the pruner may stop it (default: a quarter of train.rounds)",
    )
    tune.add_argument(
        "--objective",
        choices=("best", "final"),
        default="best",
        help="best round accuracy (default) or the last evaluated round's",
    )
    tune.add_argument(  # the names of rayfed.tuning.study.SAMPLERS, which imports Optuna; checked when tuning starts
        "--sampler",
        default="tpe",
        metavar="NAME",
        help="tpe (default) or random; each session's seed follows from --seed and the trials already finished",
    )
    tune.add_argument("--seed", type=int, help="sampler seed (default: the config's seed)")
    tune.add_argument("--timeout", type=float, metavar="SECONDS", help="stop starting trials after this long")
    tune.add_argument("--top", type=int, default=10, help="rows in the best-trials table (default 10)")
    tune.add_argument("--no-plots", action="store_true", help="do not write plots")
    tune.add_argument(
        "--progress", action="store_true", help="show each trial's progress bars (in place of a line per round)"
    )
    tune.set_defaults(handler=_tune)
    return tune


def _tune(ns: argparse.Namespace) -> int:
    import optuna

    from rayfed.config.args import config_from_args, named_plugins
    from rayfed.tuning.progress import TrialLines, round_lines
    from rayfed.tuning.pruning import check_warmup
    from rayfed.tuning.report import best_trials_table, write_plots
    from rayfed.tuning.storage import default_storage_url
    from rayfed.tuning.study import tune
    from rayfed.tuning.study_code import check_named_code

    if ns.pruner_warmup is not None:
        check_warmup(ns.pruner_warmup, "--pruner-warmup")
    logging.getLogger("rayfed").setLevel(logging.INFO)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # its line per trial: TrialLines says more
    name = ns.study_name or Path(ns.space).stem
    study_dir = Path(ns.study_dir or Path("runs") / "tune" / name)
    with accept_plugins(*ns.accept_plugin):  # a resumed study whose code changed continues only if told so
        check_named_code(named_plugins(ns.args), name, study_dir, ns.storage)  # before any of it is imported
        config = config_from_args(ns.args)
        if not ns.progress and not any(a.startswith("engine.progress=") for a in ns.args):
            config = config.override({"engine.progress": False})  # no bars from parallel trials: lines instead
        study = tune(  # Ctrl-C: StudyInterrupted, printed by rayfed.cli.main with this command to resume
            config,
            ns.space,
            n_trials=ns.trials,
            study_name=name,
            study_dir=study_dir,
            storage=ns.storage,
            pruner=ns.pruner,
            pruner_warmup=ns.pruner_warmup,
            objective=ns.objective,
            sampler=ns.sampler,
            seed=ns.seed,
            parallel_trials=ns.parallel,
            timeout_s=ns.timeout,
            callbacks=[TrialLines(ns.trials)],
            trial_callbacks=None if config.engine.progress else round_lines,
        )
    print(best_trials_table(study, top=ns.top))
    if not ns.no_plots:
        for path in write_plots(study, study_dir):
            print(f"plot: {path}")
    storage = ns.storage or default_storage_url(study_dir)
    if not storage.startswith("journal://"):
        print(f"watch it with: optuna-dashboard {storage}   (pip install optuna-dashboard)")
    return 0
