"""What differential privacy costs FedAvg and the personalised methods it protects (docs/privacy.md).

The same clients, data and rounds train each method of ``--methods`` (FedAvg and Ditto by default, FedProx,
FedAdam, FedUV or SGDM besides: Ditto's personal models never leave their clients, only its global track is
uploaded and noised) without privacy
and then with central DP-FedAvg at each noise multiplier of ``--noise`` (``privacy.clip_norm=--clip``), and the
accountant gives the ε each run spends at δ = 1e-5. cwFedAvg, which uploads its class-wise aggregation weights
beside its model and is protected part by part, is compared on MNIST in ``examples/private_cwfedavg.py``.

It prints one line per run (final pooled accuracy, ε) and writes ``accuracy_vs_epsilon.png`` into ``--out``: each
method's final accuracy against the ε it spent, the run without privacy drawn at the right as ε = ∞.

    python examples/private_fedavg.py [--out runs/private] [--rounds 10] [--noise 0.05 0.2 1]
    python examples/private_fedavg.py data.alpha=0.1     # any field.path=value override
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rayfed import RunConfig, run
from rayfed.config import parse_override
from rayfed.results.epsilon_figure import plot_accuracy_vs_epsilon


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="FedAvg and Ditto under central DP at several noise levels")
    parser.add_argument("--out", default="runs/private", help="folder of the run directories and the figure")
    parser.add_argument("--methods", nargs="+", default=["fedavg", "ditto"], help="algorithm.name values")
    parser.add_argument("--noise", nargs="+", type=float, default=[0.05, 0.2, 1.0], help="privacy.noise_multiplier")
    parser.add_argument("--clip", type=float, default=1.0, help="privacy.clip_norm")
    parser.add_argument("--clients", type=int, default=40, help="data.num_clients")
    parser.add_argument("--per-round", type=int, default=10, help="clients a round samples")
    parser.add_argument("--rounds", type=int, default=10, help="train.rounds")
    parser.add_argument("--lr", type=float, default=0.05, help="train.lr (10x the papers' 0.005: 10 rounds learn)")
    parser.add_argument("--samples", type=int, default=6000, help="synthetic samples shared by the clients")
    parser.add_argument("overrides", nargs="*", metavar="field.path=value")
    return parser


def configs(args: argparse.Namespace) -> dict[tuple[str, float | None], RunConfig]:
    """Every run's config, keyed by (method, noise multiplier or None without privacy): the same clients and data."""
    common: dict[str, object] = {
        "data.dataset": "synthetic",
        "data.options": {"num_samples": args.samples},
        "data.num_clients": args.clients,
        "data.partition": "dirichlet",
        "data.alpha": 0.5,
        "train.rounds": args.rounds,
        "train.lr": args.lr,
        "engine.backend": "local",
        "engine.progress": False,
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
            runs[method, noise] = RunConfig().override({**common, "algorithm.name": method, **private,
                                                        "run_dir": str(out / name)})  # fmt: skip
    return runs


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    results: dict[tuple[str, float | None], tuple[float, float]] = {}
    print(f"{'run':<16} {'final acc':>9} {'epsilon':>9}", flush=True)
    for (method, noise), config in configs(args).items():
        result = run(config)
        summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
        epsilon = math.inf if summary.get("epsilon") is None else float(summary["epsilon"])
        results[method, noise] = (result.final_accuracy, epsilon)
        print(f"{Path(result.run_dir).name:<16} {result.final_accuracy:>9.4f} {epsilon:>9.3g}", flush=True)
    by_method: dict[str, list[tuple[float, float]]] = {}
    for (method, _), (accuracy, epsilon) in results.items():
        by_method.setdefault(method, []).append((epsilon, accuracy))
    figure = plot_accuracy_vs_epsilon(by_method, Path(args.out) / "accuracy_vs_epsilon.png", delta=1e-5)
    print(f"figure: {figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
