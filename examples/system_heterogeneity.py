"""Synchronous FedAvg against FedBuff on the same heterogeneous devices, in virtual time (docs/system.md).

Every client gets a device drawn log-normally (``system.devices=lognormal``, a strong spread of speeds:
``--compute-spread``, σ of ln(slowdown)), and four runs train on the same devices, the same data and the same
number of client updates:

* **FedAvg, synchronous, no deadline**: each round samples ``--per-round`` clients and waits for the slowest;
* **FedAvg, deadline**: the same, with a round deadline (``--deadline``, virtual seconds): late work is lost;
* **FedAvg, deadline + over-commitment**: samples ``--over-commit`` times as many and keeps the first that
  finish by the deadline (FedScale's over-commitment);
* **FedBuff**: ``--concurrency`` clients train at once and the server steps every ``--per-round`` arrivals
  (buffer K), staleness-weighted 1/√(1 + staleness) (Nguyen et al., AISTATS 2022).

It prints each run's virtual time (seconds) to ``--target`` pooled test accuracy (``summary.json``'s
``virtual_time_to_target_s``, "not reached" if it never did), and writes ``accuracy.png`` into ``--out``: the
four runs' accuracy against rounds and, beside it, against virtual time. Measured figures are in docs/system.md
("What the example shows").

    python examples/system_heterogeneity.py [--out runs/system] [--rounds 20] [--target 0.5]
    python examples/system_heterogeneity.py system.compute_spread=0.3     # any field.path=value override
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rayfed import RunConfig, run
from rayfed.config import parse_override
from rayfed.results.plots import load_run, plot_accuracy_curves


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Synchronous FedAvg vs FedBuff on heterogeneous devices")
    parser.add_argument("--out", default="runs/system", help="folder of the four run directories and the figure")
    parser.add_argument("--clients", type=int, default=50, help="data.num_clients")
    parser.add_argument("--per-round", type=int, default=5, help="clients a synchronous round keeps; FedBuff's K")
    parser.add_argument("--concurrency", type=int, default=15, help="FedBuff's C, the clients training at once")
    parser.add_argument("--rounds", type=int, default=20, help="synchronous rounds, and FedBuff's server steps")
    parser.add_argument("--compute-spread", type=float, default=1.0, help="σ of ln(slowdown) (FedScale: 0.6)")
    parser.add_argument("--deadline", type=float, default=8.0, help="the deadline's virtual seconds")
    parser.add_argument("--over-commit", type=float, default=1.6, help="system.over_commit of the last FedAvg")
    parser.add_argument("--target", type=float, default=0.5, help="pooled test accuracy to reach, in (0, 1]")
    parser.add_argument("--lr", type=float, default=0.05, help="train.lr (10x the papers' 0.005: 20 rounds learn)")
    parser.add_argument("--samples", type=int, default=6000, help="synthetic samples shared by the clients")
    parser.add_argument("overrides", nargs="*", metavar="field.path=value")
    return parser


def configs(args: argparse.Namespace) -> dict[str, RunConfig]:
    """The four runs' configs: the same data, devices (``system.seed``) and client updates."""
    out = Path(args.out)
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
        "system.devices": "lognormal",
        "system.compute_spread": args.compute_spread,
        "system.target_accuracy": args.target,
    }
    deadline = {"system.deadline_s": args.deadline}
    variants: dict[str, dict[str, object]] = {
        "fedavg": {"algorithm.name": "fedavg"},
        "fedavg-deadline": {"algorithm.name": "fedavg", **deadline},
        "fedavg-overcommit": {"algorithm.name": "fedavg", **deadline, "system.over_commit": args.over_commit},
        "fedbuff": {
            "algorithm.name": "fedbuff",
            "engine.join_ratio": 1.0,  # FedBuff draws its own clients, among those online and idle
            "algorithm.params": {"concurrency": args.concurrency, "buffer_size": args.per_round},
        },
    }
    extra = dict(parse_override(text) for text in args.overrides)
    return {
        name: RunConfig().override({**common, **variant, **extra, "run_dir": str(out / name)})
        for name, variant in variants.items()
    }


def seconds_to_target(run_dir: Path) -> float | None:
    """Virtual seconds to the target accuracy, from the run's ``summary.json`` (None: never reached)."""
    return json.loads((run_dir / "summary.json").read_text())["virtual_time_to_target_s"]


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    runs = configs(args)
    print(f"{'run':<18} {'final acc':>9} {'virtual s':>9} {'s to ' + format(args.target, 'g'):>11}", flush=True)
    for name, config in runs.items():
        result = run(config)
        reached = seconds_to_target(Path(result.run_dir))
        total_s = result.history[-1]["virtual_time_s"]
        shown = "not reached" if reached is None else f"{reached:.1f}"
        print(f"{name:<18} {result.final_accuracy:>9.4f} {total_s:>9.1f} {shown:>11}", flush=True)
    figure = plot_accuracy_curves([load_run(Path(c.run_dir)) for c in runs.values()], Path(args.out) / "accuracy.png")
    print(f"figure: {figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
