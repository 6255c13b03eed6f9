"""FedAvg, cwFedAvg and FedRep under central differential privacy, on the same MNIST clients (docs/privacy.md).

Each method of ``--methods`` trains without privacy and with central DP at each noise multiplier of ``--noise``
(``privacy.clip_norm=--clip``), on the same clients, data and sampled rounds; the accountant gives the ε each run
spends at δ = 1e-5, the same for every method at one multiplier (cwFedAvg's two uploaded parts share it:
docs/privacy.md, "Methods that upload more than a model"). FedRep's heads never leave their clients: only its
shared body is uploaded, clipped and noised.

It prints a table (final pooled accuracy of each method at each ε) and writes ``accuracy_vs_epsilon.png`` into
``--out``: each method's final accuracy against the ε it spent, the run without privacy drawn at the right.

MNIST is read from ``--root`` (default ``$RAYFED_DATA``, else ``$RAYFED_TEST_DATA``) as ``MNIST/raw/*.gz``;
``--offline`` takes the synthetic set instead.

    python examples/private_cwfedavg.py --root ~/data [--out runs/private_cwfedavg] [--noise 0.03 0.1 0.3]
    python examples/private_cwfedavg.py --offline --rounds 2      # no files needed
    python examples/private_cwfedavg.py --root ~/data data.alpha=0.1   # any field.path=value override
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from rayfed import RunConfig, run
from rayfed.config import parse_override
from rayfed.results.epsilon_figure import plot_accuracy_vs_epsilon
from rayfed.util.errors import RayfedError

METHODS = {
    "fedavg": {"algorithm.name": "fedavg"},
    "cwfedavg": {"algorithm.name": "cwfedavg"},
    "fedrep": {"algorithm.name": "fedrep"},
}
"""The compared methods: one global model, class-wise heads weighted by p̃ (two parts), a shared body."""


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data_root = os.environ.get("RAYFED_DATA") or os.environ.get("RAYFED_TEST_DATA")
    parser.add_argument("--root", default=data_root, help="folder holding MNIST/raw/*.gz")
    parser.add_argument("--offline", action="store_true", help="the synthetic dataset instead of MNIST")
    parser.add_argument("--out", default="runs/private_cwfedavg", help="folder of the run directories and figure")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--noise", nargs="+", type=float, default=[0.03, 0.1, 0.3], help="privacy.noise_multiplier")
    parser.add_argument("--clip", type=float, default=1.0, help="privacy.clip_norm")
    parser.add_argument("--clients", type=int, default=200, help="data.num_clients (MNIST's 70,000 images shared)")
    parser.add_argument("--per-round", type=int, default=20, help="clients a round samples")
    parser.add_argument("--rounds", type=int, default=10, help="train.rounds")
    parser.add_argument("--lr", type=float, default=0.05, help="train.lr")
    parser.add_argument("overrides", nargs="*", metavar="field.path=value")
    return parser


def configs(args: argparse.Namespace) -> dict[tuple[str, float | None], RunConfig]:
    """Every run's config, keyed by (method, noise multiplier or None without privacy): the same clients and data."""
    data: dict[str, object] = (
        {"data.dataset": "synthetic", "data.options": {"num_samples": 40 * args.clients}}
        if args.offline
        else {"data.dataset": "mnist", "data.root": args.root}
    )
    common: dict[str, object] = {
        **data,
        "data.num_clients": args.clients,
        "data.partition": "dirichlet",
        "data.alpha": 0.3,
        "model.name": "cnn4",
        "train.rounds": args.rounds,
        "train.lr": args.lr,
        "engine.backend": "local",
        "engine.progress": False,
        "engine.checkpoint_every": 0,
        "engine.eval_every": args.rounds,
        "engine.join_ratio": args.per_round / args.clients,
        **dict(parse_override(text) for text in args.overrides),
    }
    out, runs = Path(args.out), {}
    for method in args.methods:
        for noise in [None, *args.noise]:
            private = {} if noise is None else {
                "privacy.mechanism": "central", "privacy.clip_norm": args.clip, "privacy.noise_multiplier": noise
            }  # fmt: skip
            name = f"{method}-{'off' if noise is None else f'z{noise:g}'}"
            overrides = {**common, **METHODS[method], **private, "run_dir": str(out / name)}
            runs[method, noise] = RunConfig().override(overrides)
    return runs


def table(results: dict[tuple[str, float | None], tuple[float, float]], methods: list[str]) -> list[str]:
    """One line per noise level: its ε and each method's final pooled accuracy."""
    levels = list(dict.fromkeys(noise for _, noise in results))
    lines = [f"{'noise':>8} {'epsilon':>9} " + " ".join(f"{m:>9}" for m in methods)]
    for noise in levels:
        epsilon = results[methods[0], noise][1]
        accuracies = " ".join(f"{results[m, noise][0]:>9.4f}" for m in methods)
        lines.append(f"{'off' if noise is None else f'{noise:g}':>8} {epsilon:>9.4g} {accuracies}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    if not args.offline and not args.root:
        parser.error("MNIST is needed: give --root DIR (holding MNIST/raw/*.gz), or --offline")
    results: dict[tuple[str, float | None], tuple[float, float]] = {}
    for (method, noise), config in configs(args).items():
        started = time.perf_counter()
        try:
            result = run(config)
        except RayfedError as error:  # bad input or missing data: one line, as rayfed run says it
            print(f"private_cwfedavg.py: error: {error}", file=sys.stderr)
            return 2
        summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
        epsilon = math.inf if summary.get("epsilon") is None else float(summary["epsilon"])
        results[method, noise] = (result.final_accuracy, epsilon)
        seconds = time.perf_counter() - started
        print(f"{Path(result.run_dir).name:<16} acc {result.final_accuracy:.4f} eps {epsilon:.4g} ({seconds:.0f} s)")
    print("\n".join(table(results, args.methods)))
    by_method: dict[str, list[tuple[float, float]]] = {}
    for (method, _), (accuracy, epsilon) in results.items():
        by_method.setdefault(method, []).append((epsilon, accuracy))
    figure = plot_accuracy_vs_epsilon(by_method, Path(args.out) / "accuracy_vs_epsilon.png", delta=1e-5)
    print(f"figure: {figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
