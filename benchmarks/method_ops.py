"""ATen operations per client-step of every registered method, sequential against stacked, on the CPU.

A GPU runs a small model's step at the speed its host issues kernels, so the operations a step issues are
what a method costs there; on a CPU the same code issues the same operations, so this table guards the
fast path between the times a GPU is at hand. For each method: one ``ClientRunner.train`` call of
``--clients`` clients (cnn4 on 1x28x28 synthetic images, ``--samples`` training samples each, batch 10, one
epoch; FedClassAvg on its own network ``fca_resnet18``), its own default hyper-parameters, one torch thread,
measured after a warm-up call (the first round's state then exists), once with ``engine.vectorize=off``
and once with ``on`` (all clients in one stack). Counted as ``benchmarks/step_overhead.py`` counts them:
every ``aten::`` event of the call, and the host syncs.

    python benchmarks/method_ops.py [--clients 8] [--samples 50] [--methods fedavg,fedawa]

One row per method: ops per client-step off and on, their ratio, host syncs per client-step, and whether
the call stacked. The last line: ``methods=<n> stacked=<methods whose call stacked>
worst_on_vs_off=<largest on/off ratio> max_syncs_per_step=<largest syncs per client-step>``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_overhead import Count, count  # noqa: E402  (a sibling script)

from rayfed import RunConfig  # noqa: E402
from rayfed.algorithms import ALGORITHMS, RoundContext, resolve  # noqa: E402
from rayfed.engine.inputs import RunInputs  # noqa: E402
from rayfed.execution.client_runner import ClientRunner  # noqa: E402
from rayfed.execution.server import Server  # noqa: E402

OVERRIDES: dict[str, dict[str, Any]] = {
    "fedclassavg": {"model.name": "fca_resnet18", "train.batch_size": 10},
    "ktpfl": {"algorithm.params": {"public_size": 40}},
    "apple": {"algorithm.params": {"anneal_rounds": 2}},
    "fedlaw": {"algorithm.params": {"server_epochs": 2, "proxy_size": 40}},  # the default proxy leaves 2 steps a client
}
"""What a method needs to run on this workload (its own networks), or to keep its server cheap."""


def method_call(name: str, clients: int, samples: int, vectorize: str, root: Path) -> Any:
    """One ``ClientRunner.train`` call of ``name`` over every client, after a first round that creates their state."""
    test = max(samples // 5, 2)
    config = RunConfig().override(
        {
            "data.options": {"num_samples": (samples + test) * clients},
            "data.num_clients": clients,
            "data.partition": "iid",
            "data.train_fraction": samples / (samples + test),
            "model.name": "cnn4",
            "algorithm.name": name,
            "train.batch_size": 10,
            "train.lr": 0.005,
            "engine.vectorize": vectorize,
            "engine.stack_size": clients,
            "engine.backend": "local",
            "engine.torch_threads": 1,
            **OVERRIDES.get(name, {}),
        }
    )
    inputs = RunInputs.prepare(config, resolve(config.algorithm), root / f"{name}-{vectorize}", continues=False)
    runner = ClientRunner(config, inputs.spec.for_clients(), inputs.dataset, inputs.partition)
    server = Server(config, inputs.spec, inputs.initial)
    ids = list(range(clients))
    states: dict[int, Any] = {}
    round_index = [0]

    def work() -> int:
        ctx = RoundContext(round=round_index[0], seed=0, lr=config.train.lr, sampled=np.arange(clients))
        result = runner.train(server.broadcast(), ctx, ids, states)
        states.update(result.states)
        server.aggregate(ctx, result.contribution)
        round_index[0] += 1
        return sum(report.steps for report in result.reports)

    return work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8, help="clients in the call (one stack)")
    parser.add_argument("--samples", type=int, default=50, help="training samples per client (batch 10)")
    parser.add_argument("--methods", default="", help="comma-separated methods (default: every registered one)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    methods = [m for m in args.methods.split(",") if m] or sorted(ALGORITHMS)
    started = time.perf_counter()
    print(f"{'method':>12} {'off ops/step':>13} {'on ops/step':>12} {'on/off':>7} {'syncs/step':>11}  stacked")
    ratios, syncs, stacked = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in methods:
            counts: dict[str, Count] = {}
            for mode in ("off", "on"):
                counts[mode] = count(method_call(name, args.clients, args.samples, mode, Path(tmp)))
            off, on = (counts[m].ops / max(counts[m].client_steps, 1) for m in ("off", "on"))
            step_syncs = max(counts[m].syncs / max(counts[m].client_steps, 1) for m in ("off", "on"))
            did_stack = on <= 0.5 * off
            ratios.append(on / off)
            syncs.append(step_syncs)
            stacked.extend([name] if did_stack else [])
            print(
                f"{name:>12} {off:13.1f} {on:12.1f} {on / off:7.3f} {step_syncs:11.3f}  {'yes' if did_stack else 'no'}",
                flush=True,
            )
    print(f"measured in {time.perf_counter() - started:.1f} s")
    print(
        f"methods={len(methods)} stacked={len(stacked)} worst_on_vs_off={max(ratios):.3f} "
        f"max_syncs_per_step={max(syncs):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
