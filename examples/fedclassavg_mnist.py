"""FedClassAvg on MNIST against local-only training and FedAvg, small enough for a CPU.

    python examples/fedclassavg_mnist.py --root ~/data --num-samples 2700 --rounds 5
    python examples/fedclassavg_mnist.py --root ~/data --download          # fetch MNIST first (network)
    python examples/fedclassavg_mnist.py --offline --rounds 2              # the synthetic set, no files needed
    python examples/fedclassavg_mnist.py --root ~/data train.lr=0.0005     # any field.path=value, as rayfed run

MNIST is read from ``--root`` (default ``$RAYFED_DATA``), as ``MNIST/raw/*.gz``; without it the
script says so in one line and names the two ways on (``--download``, ``--offline``).

Runs, for both partitions (Dirichlet 0.5 and two classes per client), 20 clients:

* ``fedclassavg``: heterogeneous clients (client c gets ResNet-18, ShuffleNetV2, GoogLeNet,
  AlexNet for c mod 4), classifier averaging, SupCon + CE + prox, Adam;
* ``local``: the same networks and the same local objective without prox
  (``algorithm.client="fedclassavg"``, ρ = 0), and no federation at all;
* ``fedavg``: the 4-layer CNN (``cnn4``), averaged whole, plain SGD.

MNIST is sub-sampled at random (``--num-samples`` of the 70,000 merged images) so that
heterogeneous ResNet-18 / GoogLeNet training fits the time budget; each client keeps 75 %
of its share for training and 25 % as its local test set. It prints one line per run and
writes ``summary.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from rayfed import RunConfig, run
from rayfed.config import parse_override
from rayfed.data import DATASETS, ArrayDataset, make_synthetic
from rayfed.data.torchvision_data import load_mnist
from rayfed.models.fedclassavg_nets import FEDCLASSAVG_MODELS
from rayfed.util.errors import RayfedError


@DATASETS.register("mnist_subset")
def load_mnist_subset(
    root: str | None, *, download: bool = False, seed: int = 0, num_samples: int = 7000, subset_seed: int = 0
) -> ArrayDataset:
    """``num_samples`` images of merged MNIST drawn without replacement (``subset_seed``); with ``root=None``
    (``--offline``) of the offline synthetic set instead."""
    if root is None:
        full = make_synthetic(num_samples=max(num_samples, 1000), seed=seed)
    else:
        full = load_mnist(root, download=download, seed=seed)
    keep = np.sort(np.random.default_rng(subset_seed).choice(len(full.labels), size=num_samples, replace=False))
    return ArrayDataset(
        name="mnist_subset",
        inputs=np.ascontiguousarray(full.images[keep]),
        labels=full.labels[keep],
        num_classes=full.num_classes,
        mean=full.mean,
        std=full.std,
    )


PARTITIONS = {
    "dir0.5": {"data.partition": "dirichlet", "data.alpha": 0.5, "data.min_samples": 10},
    "2class": {"data.partition": "pathological", "data.classes_per_client": 2, "data.balance": True},
}

ALGORITHMS = {
    "fedclassavg": {
        "algorithm.name": "fedclassavg",
        "algorithm.params": {"rho": 0.1},
        "model.client_models": list(FEDCLASSAVG_MODELS),
        "train.lr": 1e-3,
    },
    "local": {
        "algorithm.name": "local",
        "algorithm.client": "fedclassavg",
        "algorithm.client_params": {"rho": 0.0, "warmup": False},
        "model.client_models": list(FEDCLASSAVG_MODELS),
        "train.lr": 1e-3,
    },
    "fedavg": {"algorithm.name": "fedavg", "model.name": "cnn4", "train.lr": 0.05},
}


def _config(args: argparse.Namespace, algorithm: str, partition: str) -> RunConfig:
    overrides: dict[str, object] = {
        "data.dataset": "mnist_subset",
        "data.root": None if args.offline else args.root,
        "data.download": args.download,
        "data.options": {"num_samples": args.num_samples},
        "data.num_clients": 20,
        "train.rounds": args.rounds,
        "train.batch_size": args.batch_size,
        "engine.backend": "local",
        "engine.progress": False,
        "engine.checkpoint_every": 0,
        "seed": args.seed,
        "run_dir": str(Path(args.out) / f"{algorithm}-{partition}"),
    }
    overrides.update(PARTITIONS[partition])
    overrides.update(ALGORITHMS[algorithm])
    overrides.update(parse_override(text) for text in args.overrides)
    return RunConfig().override(overrides)


def _summary(run_dir: Path, history: list[dict[str, float]]) -> dict[str, object]:
    last = history[-1]
    final = pq.read_table(run_dir / "clients" / f"round_{last['round']:06d}.parquet").to_pylist()
    accuracies = [c["test_acc"] for c in final if c["num_test"]]
    best_loss = min(history, key=lambda r: r["test_loss"] if math.isfinite(r["test_loss"]) else math.inf)
    return {
        "rounds": len(history),
        "seconds_per_round": statistics.mean(r["round_s"] for r in history),
        "final_acc_mean": statistics.mean(accuracies),
        "final_acc_std": float(np.std(accuracies)),
        "final_pooled_accuracy": last["accuracy"],
        "min_test_loss_round": best_loss["round"],
        "acc_mean_at_min_test_loss": best_loss["acc_mean"],
        "best_acc_mean": max(r["acc_mean"] for r in history),
        "bytes_up_per_client": history[0]["bytes_up"] / max(1, history[0]["num_sampled"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.environ.get("RAYFED_DATA"), help="folder holding MNIST/raw/*.gz")
    parser.add_argument("--download", action="store_true", help="let torchvision download MNIST into --root")
    parser.add_argument("--offline", action="store_true", help="the synthetic dataset instead of MNIST")
    parser.add_argument("--out", default="runs/fedclassavg_mnist")
    parser.add_argument("--num-samples", type=int, default=2700)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--partitions", default=",".join(PARTITIONS))
    parser.add_argument("overrides", nargs="*", metavar="field.path=value")
    args = parser.parse_args(argv)
    if not args.offline and not args.root:
        parser.error("MNIST is needed: give --root DIR (holding MNIST/raw/*.gz, or add --download), or --offline")
    torch.set_num_threads(1)
    results = {}
    for partition in args.partitions.split(","):
        for algorithm in args.algorithms.split(","):
            started = time.perf_counter()
            try:
                result = run(_config(args, algorithm, partition))
            except RayfedError as error:  # bad input or missing data: one line, as rayfed run says it
                print(f"fedclassavg_mnist.py: error: {error}", file=sys.stderr)
                return 2
            summary = _summary(result.run_dir, result.history)
            summary["wall_s"] = time.perf_counter() - started
            results[f"{algorithm}/{partition}"] = summary
            print(f"{algorithm:12s} {partition:7s} " + json.dumps(summary), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"summary-{args.algorithms}-{args.partitions}.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
