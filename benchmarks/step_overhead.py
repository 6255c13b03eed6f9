"""What one local step costs in operations and host syncs, rayfed against a plain PyTorch loop, on the CPU.

A GPU runs a small model's step at the speed its host issues kernels, and stalls whenever the host
reads a value back. On a CPU the same code issues the same ATen operations and reads the same
values, so counting them here guards the GPU path between the times a GPU is at hand.

One worker call of the papers' MNIST protocol, scaled down: cnn4 on 1x28x28 images, 20 clients of
50 training samples (5 steps of batch 10 each), FedAvg, lr 0.005, one local epoch, one torch thread,
measured after one warm-up call:

* **rayfed sequential**: ``ClientRunner.train`` with ``engine.vectorize=off``;
* **rayfed stacked**: the same with ``engine.vectorize=on`` (the 20 clients in one stack);
* **plain loop**: per client ``load_state_dict`` of the global model and ``randperm``, per step
  ``torch.optim.SGD(foreach=True)``'s ``zero_grad``, the forward, cross-entropy, backward and ``step``
  (the data already on the device).

ATen operations are counted with ``torch.profiler`` (every ``aten::`` event, nested ones included),
everything in the call: job building, personalisation, training, the update check, the contribution.
Host syncs are the reads that make a host wait for a GPU: scalar reads and data-dependent shapes as
the profiler records them (``aten::_local_scalar_dense``, ``aten::nonzero``, ``aten::is_nonzero``), and
copies to the host (``Tensor.cpu``, ``Tensor.tolist``), which a CPU profile cannot tell from no-ops,
counted with a ``TorchFunctionMode``; and copies *to* a device that block the host: ``Tensor.to`` /
``Tensor.cuda`` / ``Tensor.copy_`` to a device without ``non_blocking=True``, and ``torch.tensor`` /
``torch.as_tensor`` of host data on a device (on a CPU they name the device the copy would go to; rayfed's
host-to-device copies go through ``rayfed.train.host.to_device``, which stages them in pinned memory and
copies without blocking).

    python benchmarks/step_overhead.py [--clients 20] [--samples 50]

The last line: ``seq_ops_vs_plain=<ATen ops per client-step, rayfed sequential / plain loop>
stacked_ops_vs_plain=<ATen ops per stacked step of all clients / plain ops per step>
syncs_per_step=<host syncs per client-step, the worse of the two rayfed paths>
seq_accumulations_per_step=<gradients autograd added into a .grad per client-step, rayfed sequential>``: 0, since
the sequential step takes each gradient from backward and updates its parameter from it, where adding it into a
zeroed buffer first costs passes over the model that a CPU feels (benchmarks/README.md, "Throughput").
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch._C._profiler import _ExperimentalConfig
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

from rayfed import RunConfig
from rayfed.algorithms import RoundContext
from rayfed.data import load_dataset, make_partition
from rayfed.engine.problem_build import build_problem
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.server import Server
from rayfed.models import build_model

SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero"})
"""Profiler events that wait for the device: a scalar read back, or an output shape that depends on values."""
ACCUMULATE = "torch::autograd::AccumulateGrad"
"""The profiler's event of autograd adding a gradient into a parameter's ``.grad`` (or taking it as the ``.grad``)."""
HOST_COPIES = frozenset({"cpu", "tolist"})
"""Tensor methods that copy to the host (on a CPU tensor they are no-ops the profiler does not see)."""
DEVICE_COPIES = frozenset({"to", "cuda", "copy_"})
"""Tensor methods that copy to a device, blocking unless asked with ``non_blocking=True``."""
HOST_DATA_ON_DEVICE = frozenset({"tensor", "as_tensor"})
"""Constructors that copy host data to the ``device`` they are given, blocking."""


class HostCopies(TorchFunctionMode):
    """Counts, while it is active, the copies that make a host wait: :data:`HOST_COPIES`, and copies to a
    device that block (:data:`DEVICE_COPIES` without ``non_blocking``, :data:`HOST_DATA_ON_DEVICE` with a
    ``device``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in HOST_COPIES or _blocking_copy(name, args, kwargs):
            self.count += 1
        return func(*args, **kwargs)


def _blocking_copy(name: str, args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a call copies to a device and blocks the host (module docstring)."""
    if name in HOST_DATA_ON_DEVICE:
        return kwargs.get("device") is not None and not isinstance(args[0] if args else None, torch.Tensor)
    if name not in DEVICE_COPIES or kwargs.get("non_blocking") or (len(args) > 2 and args[2] is True):
        return False
    if name == "copy_":  # dst.copy_(src): from the host to a device
        return (
            len(args) > 1
            and isinstance(args[1], torch.Tensor)
            and args[1].device.type == "cpu"
            and args[0].device.type != "cpu"
        )
    if name == "cuda":
        return True
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, torch.device | str) and not isinstance(target, torch.dtype)


@dataclass(frozen=True)
class Count:
    """Operations and host syncs of one measured call, and its client-steps."""

    ops: int
    syncs: int
    client_steps: int
    top: list[tuple[str, int]]
    accumulations: int
    """Gradients autograd added into a parameter's ``.grad`` (``AccumulateGrad`` nodes run)."""


def count(work: Callable[[], int], *, all_threads: bool = False) -> Count:
    """Profile ``work`` (which returns its client-steps) after one warm-up call; ``all_threads`` counts the
    operations of every thread (runs packed by ``rayfed.run_many`` train in threads), else this thread's."""
    work()
    threads = _ExperimentalConfig(profile_all_threads=True) if all_threads else None
    with HostCopies() as copies, profile(activities=[ProfilerActivity.CPU], experimental_config=threads) as prof:
        steps = work()
    names = collections.Counter(event.name for event in prof.events() if event.name.startswith("aten::"))
    syncs = sum(n for name, n in names.items() if name in SYNC_OPS) + copies.count
    accumulations = sum(1 for event in prof.events() if event.name == ACCUMULATE)
    return Count(sum(names.values()), syncs, steps, names.most_common(12), accumulations)


def rayfed_call(clients: int, samples: int, vectorize: str) -> Callable[[], int]:
    """One ``ClientRunner.train`` call over every client of the workload."""
    config = RunConfig().override(
        {
            "data.options": {"num_samples": (samples + samples // 5) * clients},
            "data.num_clients": clients,
            "data.partition": "iid",
            "data.train_fraction": samples / (samples + samples // 5),
            "model.name": "cnn4",
            "algorithm.name": "fedavg",
            "train.batch_size": 10,
            "train.lr": 0.005,
            "engine.vectorize": vectorize,
            "engine.stack_size": clients,
            "engine.backend": "local",
            "engine.torch_threads": 1,
        }
    )
    dataset = load_dataset("synthetic", None, seed=config.data.seed, options=config.data.options)
    partition = make_partition(dataset.labels, dataset.num_classes, config.data)
    spec, initial = build_problem(config, dataset)
    broadcast = Server(config, spec, initial).broadcast()
    runner = ClientRunner(config, spec, dataset, partition)
    ids = list(range(clients))
    ctx = RoundContext(round=0, seed=0, lr=config.train.lr, sampled=np.arange(clients))
    return lambda: sum(report.steps for report in runner.train(broadcast, ctx, ids).reports)


def plain_call(clients: int, samples: int) -> Callable[[], int]:
    """The plain loop over the same work, data resident."""
    torch.manual_seed(0)
    model, start = build_model("cnn4", (1, 28, 28), 10), build_model("cnn4", (1, 28, 28), 10)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.005, foreach=True)
    data = [(torch.randn(samples, 1, 28, 28), torch.randint(0, 10, (samples,))) for _ in range(clients)]

    def work() -> int:
        steps = 0
        for x, y in data:
            model.load_state_dict(start.state_dict())
            order = torch.randperm(len(x))
            for s in range(len(x) // 10):
                idx = order[s * 10 : (s + 1) * 10]
                optimiser.zero_grad(set_to_none=False)
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                optimiser.step()
                steps += 1
        return steps

    return work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=20, help="clients in the call (one stack)")
    parser.add_argument("--samples", type=int, default=50, help="training samples per client (batch 10)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    plain = count(plain_call(args.clients, args.samples))
    sequential = count(rayfed_call(args.clients, args.samples, "off"))
    stacked = count(rayfed_call(args.clients, args.samples, "on"))
    plain_per_step = plain.ops / plain.client_steps
    stacked_steps = stacked.client_steps / args.clients
    for name, measured, per in (
        ("plain loop", plain, plain.client_steps),
        ("rayfed sequential", sequential, sequential.client_steps),
        ("rayfed stacked", stacked, stacked_steps),
    ):
        unit = "stacked step" if measured is stacked else "client-step"
        print(
            f"{name:>17}: {measured.ops / per:7.1f} ATen ops and {measured.accumulations / per:4.1f} gradient "
            f"accumulations per {unit}, {measured.syncs} host syncs in {measured.client_steps} client-steps; "
            "most frequent: " + ", ".join(f"{op.removeprefix('aten::')} {n / per:.1f}" for op, n in measured.top[:6]),
            flush=True,
        )
    print(f"measured in {time.perf_counter() - started:.1f} s", flush=True)
    summary = {
        "seq_ops_vs_plain": sequential.ops / sequential.client_steps / plain_per_step,
        "stacked_ops_vs_plain": stacked.ops / stacked_steps / plain_per_step,
        "syncs_per_step": max(sequential.syncs / sequential.client_steps, stacked.syncs / stacked.client_steps),
        "seq_accumulations_per_step": sequential.accumulations / sequential.client_steps,
    }
    print(" ".join(f"{k}={v:.3f}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
