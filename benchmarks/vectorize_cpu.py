"""Stacked (``engine.vectorize="on"``) against sequential client training, side by side, on this machine.

One :class:`~rayfed.execution.client_runner.ClientRunner` per mode trains the same batch of clients
(FedAvg, the 4-layer CNN on 1x28x28 synthetic images, 50 training samples per client,
batch 10, one epoch, lr 0.005) from the same broadcast, alternating between the modes so
both see the same machine load. One torch thread, as in a ClientWorker. Reports the
median wall-clock and CPU seconds per client of each mode, the ratio (stacked speed /
sequential speed), and the largest difference between the two modes' summed updates.

    python benchmarks/vectorize_cpu.py [--clients 50] [--stack-size 64] [--repeats 5]

The last line is ``vectorized_over_sequential=<ratio>`` (> 1: stacking is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from rayfed import RunConfig
from rayfed.algorithms import RoundContext
from rayfed.data import load_dataset, make_partition
from rayfed.engine.problem_build import build_problem
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.server import Server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50, help="clients in the worker call")
    parser.add_argument("--stack-size", type=int, default=64, help="engine.stack_size")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per mode, after one warm-up")
    args = parser.parse_args(argv)
    base = RunConfig().override(
        {
            "data.options": {"num_samples": 60 * args.clients},
            "data.num_clients": args.clients,
            "data.partition": "iid",
            "data.train_fraction": 50 / 60,
            "algorithm.name": "fedavg",
            "engine.torch_threads": 1,
            "engine.stack_size": args.stack_size,
        }
    )
    data = base.data
    dataset = load_dataset(data.dataset, data.root, seed=data.seed, options=data.options)
    partition = make_partition(dataset.labels, dataset.num_classes, data)
    spec, initial = build_problem(base, dataset)
    broadcast = Server(base, spec, initial).broadcast()
    ids = list(range(args.clients))
    runners = {
        mode: ClientRunner(base.override({"engine.vectorize": mode}), spec, dataset, partition)
        for mode in ("off", "on")
    }
    wall: dict[str, list[float]] = {mode: [] for mode in runners}
    cpu: dict[str, list[float]] = {mode: [] for mode in runners}
    totals = {}
    for repeat in range(args.repeats + 1):
        ctx = RoundContext(round=repeat, seed=0, lr=0.005, sampled=np.array(ids))
        for mode, runner in runners.items():
            w, c = time.perf_counter(), time.process_time()
            result = runner.train(broadcast, ctx, ids)
            if repeat:  # the first pass builds models and oneDNN kernels
                wall[mode].append((time.perf_counter() - w) / args.clients)
                cpu[mode].append((time.process_time() - c) / args.clients)
            totals[mode] = result.contribution.average()
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.clients} clients per call, "
        f"stack size {args.stack_size}, {args.repeats} repeats"
    )
    for mode, label in (("off", "sequential"), ("on", "stacked")):
        print(
            f"{label:>15}: {1000 * statistics.median(wall[mode]):7.1f} ms/client wall, "
            f"{1000 * statistics.median(cpu[mode]):7.1f} ms/client CPU"
        )
    diff = float(np.abs(totals["on"] - totals["off"]).max())
    ratio = statistics.median(wall["off"]) / statistics.median(wall["on"])
    cpu_ratio = statistics.median(cpu["off"]) / statistics.median(cpu["on"])
    print(f"largest difference between the two modes' averaged models: {diff:.2e}")
    print(f"CPU-time ratio (stacked speed / sequential speed): {cpu_ratio:.3f}")
    print(f"vectorized_over_sequential={ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
