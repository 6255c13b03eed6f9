"""Search cwFedAvg's WDR strength λ and the learning rate with Optuna, two trials at a time on Ray.

Each trial is an ordinary rayfed run on the offline synthetic dataset, in its own run
directory under the study directory; the median pruner stops trials whose round
accuracy falls below the median of earlier trials at the same round. The study lives
in ``<study-dir>/study.db``: run the script again to resume it, and watch it with
``optuna-dashboard sqlite:///<study-dir>/study.db`` (``pip install optuna-dashboard``).

    python examples/optuna_lambda_search.py --trials 12 --rounds 10
    python examples/optuna_lambda_search.py --algorithm fedprox   # the same search over FedProx's μ
    python examples/optuna_lambda_search.py --trials 2 --parallel 1 engine.backend=local   # any field=value

The command-line equivalent, with the space in a file::

    rayfed tune examples/space.yaml algorithm.name=cwfedavg data.options.num_samples=5000 \\
        data.partition=pathological train.rounds=10 --trials 12 --parallel 2
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rayfed import RunConfig
from rayfed.config import parse_override
from rayfed.tuning import FloatParam, best_trials_table, tune, write_plots

SPACES = {
    "cwfedavg": {  # λ from 1 to 5000 covers the paper's 10 (CIFAR-10) up to 2000 (Tiny-ImageNet)
        "algorithm.params.wdr_lambda": FloatParam(1.0, 5000.0, log=True),
        "train.lr": FloatParam(1e-3, 1e-1, log=True),
    },
    "fedprox": {
        "algorithm.params.mu": FloatParam(1e-4, 1.0, log=True),
        "train.lr": FloatParam(1e-3, 1e-1, log=True),
    },
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=sorted(SPACES), default="cwfedavg")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--parallel", type=int, default=2, help="trials at once, each with one 1-CPU worker")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--samples", type=int, default=5000, help="synthetic samples over all clients")
    parser.add_argument("--study-dir", default=None, help="default runs/tune/<algorithm>-lambda")
    parser.add_argument("overrides", nargs="*", metavar="field.path=value", help="any field of the trials' base config")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    base = RunConfig().override(
        {
            "algorithm.name": args.algorithm,
            "data.dataset": "synthetic",
            "data.options": {"num_samples": args.samples},
            "data.num_clients": 20,
            "data.partition": "pathological",
            "train.rounds": args.rounds,
            "engine.backend": "ray",
            "engine.num_workers": 1,  # parallel trials share the cluster: each gets 1 worker x 1 CPU
            "engine.num_cpus_per_worker": 1,
            "engine.checkpoint_every": 0,
            "engine.progress": False,
            **dict(parse_override(text) for text in args.overrides),
        }
    )
    name = f"{args.algorithm}-lambda"
    study_dir = Path(args.study_dir or Path("runs") / "tune" / name)
    study = tune(
        base,
        SPACES[args.algorithm],
        n_trials=args.trials,
        study_name=name,
        study_dir=study_dir,
        pruner="median",
        parallel_trials=args.parallel,
    )
    print(best_trials_table(study))
    for path in write_plots(study, study_dir):
        print(f"plot: {path}")
    print(f"watch it with: optuna-dashboard sqlite:///{(study_dir / 'study.db').resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
