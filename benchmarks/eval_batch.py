"""Evaluation on CPU: forward passes at the default evaluation batch against batches of 1024, side by side.

Evaluation runs every round on every client (and, for IFCA, FedFomo or KT-pFL, inside training
too), in batches of :func:`rayfed.train.evaluate.eval_batch_size` samples. Per case (a model and an
input shape from the papers' protocols, random inputs, one torch thread as in a ClientWorker),
this times :func:`~rayfed.train.evaluate.evaluate_model` over the same samples at batch 1024 (the
GPU's choice) and at the CPU default, alternating so both see the same machine load, and checks
that both give the same predictions and loss.

    python benchmarks/eval_batch.py [--repeats 5]

The last line is ``default_over_1024_<case>=<ratio>`` per case (> 1: the default is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from rayfed.models import build_model
from rayfed.train.evaluate import eval_batch_size, evaluate_model

CASES = {  # name: (model, input shape, samples: about one client's split in the protocols)
    "cnn4_mnist": ("cnn4", (1, 28, 28), 2625),
    "cnn4_cifar": ("cnn4", (3, 32, 32), 2000),
    "resnet20_cifar": ("resnet20", (3, 32, 32), 1000),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per batch size, after one warm-up")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    default = eval_batch_size(torch.device("cpu"))
    print(f"torch {torch.__version__}, 1 thread, default CPU evaluation batch {default}, {args.repeats} repeats")
    ratios = {}
    for case, (model_name, shape, samples) in CASES.items():
        generator = torch.Generator().manual_seed(0)
        torch.manual_seed(0)
        model = build_model(model_name, shape, 10)
        x = torch.randn(samples, *shape, generator=generator)
        y = torch.randint(0, 10, (samples,), generator=generator)
        seconds: dict[int, list[float]] = {1024: [], default: []}
        stats = {}
        with torch.no_grad():
            for repeat in range(args.repeats + 1):
                for batch in seconds:
                    start = time.perf_counter()
                    stats[batch] = evaluate_model(model, x, y, batch)
                    if repeat:  # the first pass builds the oneDNN kernels
                        seconds[batch].append(time.perf_counter() - start)
        same = stats[1024].correct == stats[default].correct
        loss_gap = abs(stats[1024].loss_sum - stats[default].loss_sum) / stats[1024].loss_sum
        per_sample = {b: 1e6 * statistics.median(s) / samples for b, s in seconds.items()}
        ratios[case] = per_sample[1024] / per_sample[default]
        print(
            f"{case:>15}: batch 1024 {per_sample[1024]:7.0f} us/sample, batch {default} "
            f"{per_sample[default]:7.0f} us/sample, ratio {ratios[case]:.2f}; same predictions: {same}, "
            f"relative loss difference {loss_gap:.1e}"
        )
    print(" ".join(f"default_over_1024_{case}={ratio:.3f}" for case, ratio in ratios.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
