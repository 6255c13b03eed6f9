"""Client updates per second: rayfed on Ray against plain PyTorch loops, up to the machine's 2-process limit.

Two workloads (FedAvg, the papers' 4-layer CNN on 1x28x28 synthetic images, 50 training
and 10 test samples per client, batch 10, one local epoch, SGD lr 0.005):

* S1: 100 clients, all of them trained every round;
* S2: 1,000 clients, 100 sampled per round.

Every round trains the sampled clients, aggregates them (sample-size weighted average)
and evaluates the new global model on the sampled clients' test sets
(``engine.eval_clients="sampled"``). Three loops do exactly that work with PyTorch alone,
the data pre-loaded as normalised tensors, ``torch.optim.SGD``, a running weighted sum:

* the plain loop: one process, one model, torch's default number of threads (what the
  last line's ``throughput_ratio`` compares with, as the workload was first specified);
* the same loop with the model channels-last (``model.to(memory_format=
  torch.channels_last)``), the one change a PyTorch expert would make for this CNN on CPU;
* the 2-process loop (:class:`TwoProcessLoop`), the best such an expert can write for a
  2-core box without a framework: one process per core with one torch thread, each
  training its half of the round's clients on the channels-last model and summing them;
  the parent averages the two sums and evaluates. ``limit_ratio`` compares with it.

All draw the same clients and the same mini-batch orders as rayfed, so all reach the same
accuracy in every round (printed as a check). They run interleaved, round by round:
rayfed's round t, then each loop's round t (while rayfed's workers wait), then rayfed's
round t+1, and so on, so a drift in the machine's speed (the box is shared) weighs on all
alike. What a timed round holds, on either side: sampling the clients, training them,
aggregating and evaluating; for rayfed also the Ray calls, the broadcast through the object
store and the metrics files it writes every round (``RoundTimer``); for the 2-process loop
the pipe messages and the shared-memory sums. Outside every round: starting Ray and the
actors or the loop's processes, loading data, building models. The first round of each is
warm-up; the result is the median over the other rounds. Checkpoints are off
(``engine.checkpoint_every=0``): the loops write none either.

rayfed starts and afterwards stops a private local Ray, as ``rayfed.run`` does for users,
with one ClientWorker per core (one torch thread each). After the timed runs, S2 runs once
more with rayfed alone, in a fresh driver process (``--pss-of s2``; the driver of the timed
run also holds the plain loops), while a thread samples the proportional set size (PSS) of
its processes every 0.5 s (driver, ClientWorkers, ServerActor and Ray's daemons); the peak
is reported. The last line::

    throughput_ratio_s1=<x> throughput_ratio_s2=<y> limit_ratio_s1=<x> limit_ratio_s2=<y> rayfed_peak_pss_mb_s2=<m>

``throughput_ratio`` is rayfed's updates per second over the plain loop's, ``limit_ratio``
over the 2-process loop's. Measurements, and what was tried to make rayfed faster, are in
benchmarks/README.md ("Throughput" section).

Run: ``python benchmarks/throughput.py [--rounds 11] [--out FILE.json | --record]``; ``--record`` writes the
figures, with the commit measured, to ``benchmarks/results/throughput.json`` (tracked), ``--out`` anywhere else;
``--vectorize on`` trains the clients of a worker call stacked (``engine.vectorize``). To compare a branch with
another interleaved: ``python benchmarks/compare.py --base main``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    CpuMeter,
    PssSampler,
    RoundTimer,
    add_output_arguments,
    median_after_warmup,
    output_path,
    process_cpu_s,
    provenance,
)

from rayfed import RunConfig, run  # noqa: E402
from rayfed.algorithms.common.proximal import flatten_logically
from rayfed.data import load_dataset, make_partition, normalize_batch  # noqa: E402
from rayfed.engine.problem_build import build_problem  # noqa: E402
from rayfed.models import build_model  # noqa: E402
from rayfed.train.flat import FlatModel  # noqa: E402
from rayfed.util.seeding import client_seed, sample_clients  # noqa: E402

SAMPLES_PER_CLIENT = 60
TRAIN_PER_CLIENT = 50


@dataclass(frozen=True)
class Scenario:
    name: str
    num_clients: int
    join_ratio: float

    @property
    def sampled_per_round(self) -> int:
        return max(1, int(self.join_ratio * self.num_clients)) if self.join_ratio < 1 else self.num_clients


SCENARIOS = {"s1": Scenario("s1", 100, 1.0), "s2": Scenario("s2", 1000, 0.1)}


def scenario_config(s: Scenario, args: argparse.Namespace, run_dir: Path) -> RunConfig:
    return RunConfig().override(
        {
            "data.dataset": "synthetic",
            "data.options": {"num_samples": SAMPLES_PER_CLIENT * s.num_clients},
            "data.num_clients": s.num_clients,
            "data.partition": "iid",
            "data.train_fraction": TRAIN_PER_CLIENT / SAMPLES_PER_CLIENT,
            "model.name": "cnn4",
            "train.rounds": args.rounds,
            "train.batch_size": 10,
            "train.local_epochs": 1,
            "train.lr": 0.005,
            "algorithm.name": "fedavg",
            "engine.backend": "ray",
            "engine.num_workers": args.workers,
            "engine.clients_per_call": args.clients_per_call,
            "engine.vectorize": args.vectorize,
            "engine.join_ratio": s.join_ratio,
            "engine.eval_clients": "sampled",
            "engine.checkpoint_every": 0,
            "engine.progress": False,
            "run_dir": str(run_dir),
        }
    )


# --- the plain PyTorch loop ------------------------------------------------------------------------


class PlainLoop:
    """FedAvg in one process with PyTorch alone: what a PyTorch user would write for this workload."""

    def __init__(self, config: RunConfig, *, channels_last: bool = False) -> None:
        data = config.data
        dataset = load_dataset(data.dataset, data.root, seed=data.seed, options=data.options)
        partition = make_partition(dataset.labels, dataset.num_classes, data)
        _, initial = build_problem(config, dataset)  # the same initial model as rayfed's run

        def tensors(indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            x = normalize_batch(dataset.images[indices], dataset.mean, dataset.std)
            return x, torch.from_numpy(dataset.labels[indices])

        self.config = config
        self.train = [tensors(partition.train(c)) for c in range(data.num_clients)]  # pre-loaded tensors
        self.test = [tensors(partition.test(c)) for c in range(data.num_clients)]
        self.model = build_model(config.model.name, dataset.input_shape, dataset.num_classes)
        self.channels_last = channels_last
        if channels_last:  # the expert's variant: convolution kernels (hence activations) channels-last
            self.model.to(memory_format=torch.channels_last)
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.SGD(self.params, lr=config.train.lr)
        start = FlatModel(build_model(config.model.name, dataset.input_shape, dataset.num_classes))
        start.load_state(initial[config.model.name])  # rayfed's vector stores kernels channels-last; PyTorch's does not
        self.global_vector = flatten_logically([p.detach() for p in start.module.parameters()])
        self.seconds: list[float] = []
        self.accuracies: list[float] = []

    def round(self, t: int) -> None:
        """Train the round's sampled clients, average them, evaluate them; appends the time and accuracy."""
        started = time.perf_counter()
        sampled = self.sampled(t)
        total, weight = self.train_clients(t, sampled, self.global_vector)
        self.global_vector = total / weight
        accuracy = self.evaluate(sampled, self.global_vector)
        self.seconds.append(time.perf_counter() - started)
        self.accuracies.append(accuracy)

    def sampled(self, t: int) -> list[int]:
        """Round t's clients, drawn as rayfed draws them."""
        config = self.config
        return sample_clients(config.seed, t, config.data.num_clients, config.engine.join_ratio).tolist()

    def train_clients(self, t: int, client_ids: list[int], start: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Train each client from ``start``; returns the sample-weighted sum of the trained models and the weight."""
        config, model, batch = self.config, self.model, self.config.train.batch_size
        total, weight = torch.zeros_like(start), 0
        for cid in client_ids:
            self._load(start)
            model.train()
            x, y = self.train[cid]
            n = len(y)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(client_seed(config.seed, t, cid)))
            for first in range(0, n - n % batch, batch):  # drop_last, as the papers' loaders
                idx = order[first : first + batch]
                self.optimizer.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                self.optimizer.step()
            total.add_(self._read(), alpha=n)
            weight += n
        return total, weight

    def evaluate(self, client_ids: list[int], vector: torch.Tensor) -> float:
        """Pooled accuracy of the model ``vector`` on the clients' test sets."""
        self._load(vector)
        self.model.eval()
        correct = count = 0
        with torch.no_grad():
            for cid in client_ids:
                x, y = self.test[cid]
                logits = self.model(x)
                F.cross_entropy(logits, y, reduction="sum")
                correct += int((logits.argmax(dim=1) == y).sum())
                count += len(y)
        return correct / count

    def _load(self, vector: torch.Tensor) -> None:
        if self.channels_last:  # copy into the channels-last parameters (a view would reset their layout)
            with torch.no_grad():
                for param, piece in zip(self.params, vector.split([p.numel() for p in self.params])):
                    param.copy_(piece.view_as(param))
        else:
            vector_to_parameters(vector.clone(), self.params)  # the parameters become views of this copy

    def _read(self) -> torch.Tensor:
        if self.channels_last:
            return torch.cat([p.detach().reshape(-1) for p in self.params])
        return parameters_to_vector(self.params).detach()


# --- the 2-process loop: the machine's limit without a framework ---------------------------------------


class TwoProcessLoop:
    """FedAvg on one process per core, as a PyTorch expert would write it for this box.

    Each of ``processes`` worker processes (multiprocessing's spawn context) holds the
    data and a channels-last :class:`PlainLoop` with one torch thread, and trains its
    share of the round's clients (contiguous slices of the sampled list) from the
    global model, summing them sample-weighted into its row of a shared-memory tensor.
    The parent puts the global model into shared memory, wakes the processes through
    pipes, averages their sums and evaluates with ``evaluator`` (the driver's
    channels-last loop, whose model it borrows). The timed round is what rayfed's is:
    sampling, training, averaging and evaluation; starting the processes and loading
    their data happen in the constructor, outside every round.
    """

    def __init__(self, config: RunConfig, evaluator: PlainLoop, processes: int = 2) -> None:
        context = torch.multiprocessing.get_context("spawn")
        self.evaluator = evaluator
        self.global_vector = evaluator.global_vector.clone().share_memory_()
        self.sums = torch.zeros((processes, self.global_vector.numel())).share_memory_()
        self.pipes, self.processes = [], []
        for rank in range(processes):
            here, there = context.Pipe()
            process = context.Process(
                target=_serve, args=(config, rank, self.global_vector, self.sums, there), daemon=True
            )
            process.start()
            self.pipes.append(here)
            self.processes.append(process)
        for pipe in self.pipes:
            pipe.recv()  # "ready": data loaded, model built
        self.seconds: list[float] = []
        self.cpu: list[dict[str, float]] = []
        """CPU seconds of each round: its processes' and the parent's."""
        self.phases: list[dict[str, float]] = []
        """Seconds of each round's phases: training (sending the clients to the processes until both answered),
        averaging their sums, evaluating."""
        self.accuracies: list[float] = []

    def round(self, t: int) -> None:
        cpu = self._cpu()
        started = time.perf_counter()
        sampled = self.evaluator.sampled(t)
        share = -(-len(sampled) // len(self.pipes))
        for rank, pipe in enumerate(self.pipes):
            pipe.send((t, sampled[rank * share : (rank + 1) * share]))
        weight = sum(pipe.recv() for pipe in self.pipes)
        trained = time.perf_counter()
        self.global_vector.copy_(self.sums.sum(dim=0).div_(weight))
        aggregated = time.perf_counter()
        accuracy = self.evaluator.evaluate(sampled, self.global_vector)
        finished = time.perf_counter()
        self.seconds.append(finished - started)
        self.cpu.append({name: spent - before for (name, spent), before in zip(self._cpu().items(), cpu.values())})
        self.phases.append(
            {"train": trained - started, "aggregate": aggregated - trained, "evaluate": finished - aggregated}
        )
        self.accuracies.append(accuracy)

    def _cpu(self) -> dict[str, float]:
        """CPU seconds so far of the processes (all) and of this one, the parent (which also evaluates)."""
        return {
            "processes": sum(process_cpu_s(p.pid) for p in self.processes if p.pid is not None),
            "parent": process_cpu_s(os.getpid()),
        }

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for process in self.processes:
            process.join()


def _serve(config: RunConfig, rank: int, global_vector: torch.Tensor, sums: torch.Tensor, pipe) -> None:
    """A :class:`TwoProcessLoop` process: train the clients each message names, until ``None``."""
    torch.set_num_threads(1)
    loop = PlainLoop(config, channels_last=True)
    pipe.send("ready")
    while (message := pipe.recv()) is not None:
        t, client_ids = message
        total, weight = loop.train_clients(t, client_ids, global_vector)
        sums[rank].copy_(total)
        pipe.send(weight)


# --- both, interleaved round by round -----------------------------------------------------------------


class Interleaved(RoundTimer):
    """Times rayfed's rounds and runs each loop's round t right after rayfed's round t.

    The loops' rounds run while rayfed's workers wait for their next call, and are left
    out of rayfed's round times; so all see the same state of the machine.
    """

    def __init__(self, *plain: PlainLoop | TwoProcessLoop) -> None:
        super().__init__()
        self.plain = plain
        self.meter = CpuMeter(os.getpid())
        self.cpu: list[dict[str, float]] = []
        """CPU seconds of rayfed's processes in each timed round, by process name (the loops' left out)."""

    def on_run_start(self, run) -> None:
        super().on_run_start(run)
        self.meter.start()

    def after_round(self, run, record, clients) -> bool:
        super().after_round(run, record, clients)
        self.cpu.append(self.meter.stop())
        for loop in self.plain:
            loop.round(record.round)
        self.meter.start()
        self._last = time.perf_counter()
        return False


PHASES = ("train", "evaluate", "aggregate", "driver")
"""Where a round goes. rayfed's from its round records (``train_s``, ``evaluate_s``, ``aggregate_s``; the
aggregation includes the next broadcast) and, as ``driver``, the rest of the timed round: the driver's work
between rounds (the metrics files, sampling, splitting the clients). The 2-process loop's ``driver`` is its
sampling and the pipe messages outside training."""


def phase_medians(history: list[dict], seconds: list[float]) -> dict[str, float]:
    """rayfed's median milliseconds per phase over the measured rounds, from its round records and the timed
    rounds ``seconds`` (:data:`PHASES`)."""
    rows = list(zip(history, seconds))[1:]
    med = {k: 1e3 * statistics.median(r[f"{k}_s"] for r, _ in rows) for k in PHASES[:3]}
    med["driver"] = 1e3 * statistics.median(s - r["round_s"] for r, s in rows)
    return med


def loop_phase_medians(loop: TwoProcessLoop) -> dict[str, float]:
    """The 2-process loop's median milliseconds per phase over the measured rounds (:data:`PHASES`)."""
    rows = list(zip(loop.phases, loop.seconds))[1:]
    med = {k: 1e3 * statistics.median(p[k] for p, _ in rows) for k in PHASES[:3]}
    med["driver"] = 1e3 * statistics.median(s - sum(p.values()) for p, s in rows)
    return med


def cpu_medians(cpu: list[dict[str, float]], seconds: list[float]) -> dict[str, float]:
    """Median CPU milliseconds per process name over the measured rounds, and ``idle_or_other``: the machine's
    cores times the round's wall time, less these processes' CPU time (cores left idle, or used by processes
    outside the measurement: on a shared box, other jobs; for the loops, also rayfed's idle Ray)."""
    rows = list(zip(cpu, seconds))[1:] or list(zip(cpu, seconds))
    cores = len(os.sched_getaffinity(0))
    names = sorted({name for spent, _ in rows for name in spent})
    med = {name: 1e3 * statistics.median(spent.get(name, 0.0) for spent, _ in rows) for name in names}
    med["idle_or_other"] = 1e3 * statistics.median(cores * wall - sum(spent.values()) for spent, wall in rows)
    return med


def _cpu(med: dict[str, float]) -> str:
    busy = sorted((k for k in med if k != "idle_or_other"), key=lambda k: -med[k])
    return ", ".join(f"{k} {med[k]:.0f}" for k in [*busy, "idle_or_other"] if med[k] >= 0.5 or k == "idle_or_other")


def _phases(med: dict[str, float]) -> str:
    return ", ".join(f"{k} {med[k]:.0f}" for k in PHASES) + f" (sum {sum(med.values()):.0f})"


def _times(seconds: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=11,
        help="rounds per measurement; the first is warm-up (the box's rounds move by 20 %% from one to the next, so "
        "the median of 10 holds a ratio to a few hundredths where that of 5 does not)",
    )
    parser.add_argument("--workers", type=int, default=0, help="ClientWorker actors (0 = one per CPU)")
    parser.add_argument(
        "--clients-per-call", type=int, default=0, help="engine.clients_per_call (0 = 2 calls per worker)"
    )
    parser.add_argument("--vectorize", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--scenarios", default="s1,s2", help="comma-separated: s1, s2")
    parser.add_argument("--no-pss", action="store_true", help="skip the PSS run of rayfed alone (S2)")
    add_output_arguments(parser, "throughput.json")
    parser.add_argument(
        "--pss-of",
        choices=sorted(SCENARIOS),
        default=None,
        help="only run rayfed on this scenario and print its processes' peak PSS as JSON",
    )
    args = parser.parse_args(argv)
    if args.pss_of:
        with tempfile.TemporaryDirectory(prefix="rayfed-pss-") as tmp:
            config = scenario_config(SCENARIOS[args.pss_of], args, Path(tmp) / args.pss_of)
            with PssSampler() as memory:
                run(config)
        print(json.dumps({"peak": memory.peak, "samples": memory.samples}))
        return 0
    scenarios = [SCENARIOS[name.strip()] for name in args.scenarios.split(",") if name.strip()]
    print(
        f"torch {torch.__version__}, default threads {torch.get_num_threads()}, rounds {args.rounds} (first excluded)",
        flush=True,
    )

    results: dict[str, dict[str, float | bool | dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="rayfed-throughput-") as tmp:
        for s in scenarios:
            results[s.name] = measure(s, scenario_config(s, args, Path(tmp) / s.name), args)
    for name, r in results.items():
        r["ratio"] = r["engine_updates_per_s"] / r["plain_updates_per_s"]
        r["limit_ratio"] = r["engine_updates_per_s"] / r["two_process_updates_per_s"]
    out = output_path(args, "throughput.json")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        arguments = {k: str(v) for k, v in vars(args).items()}
        out.write_text(json.dumps({**provenance(), "args": arguments, "results": results}, indent=2))
    fields = [f"throughput_ratio_{name}={r['ratio']:.3f}" for name, r in results.items()]
    fields += [f"limit_ratio_{name}={r['limit_ratio']:.3f}" for name, r in results.items()]
    fields += [
        f"rayfed_peak_pss_mb_{name}={r['rayfed_peak_pss_mb']:.0f}"
        for name, r in results.items()
        if "rayfed_peak_pss_mb" in r
    ]
    print(" ".join(fields))
    return 0


def measure(s: Scenario, config: RunConfig, args: argparse.Namespace) -> dict[str, float | bool | dict[str, float]]:
    """Run rayfed and the three loops interleaved on one workload; print and return their numbers.

    On S2, then, the peak PSS of rayfed's processes in a run of rayfed alone (:func:`rayfed_pss`).
    """
    plain, expert = PlainLoop(config), PlainLoop(config, channels_last=True)
    limit = TwoProcessLoop(config, evaluator=expert)
    probe = Interleaved(plain, expert, limit)
    try:
        history = run(config, callbacks=[probe]).history
    finally:
        limit.close()
    rates = [s.sampled_per_round / median_after_warmup(loop.seconds) for loop in (probe, *probe.plain)]
    gap = max(abs(a - row["accuracy"]) for loop in probe.plain for a, row in zip(loop.accuracies, history))
    result: dict[str, Any] = {
        "engine_updates_per_s": rates[0],
        "plain_updates_per_s": rates[1],
        "plain_channels_last_updates_per_s": rates[2],
        "two_process_updates_per_s": rates[3],
        "max_accuracy_difference": gap,
    }
    labels = (
        "rayfed on Ray:           ",
        "plain PyTorch loop:      ",
        "plain, channels-last:    ",
        "2 processes, 1 thread:   ",
    )
    for label, loop, rate in zip(labels, (probe, *probe.plain), rates):
        print(f"{s.name.upper()} {label}{rate:6.1f} updates/s  (rounds {_times(loop.seconds)} s)", flush=True)
    phases = {"rayfed": phase_medians(history, probe.seconds), "two_process": loop_phase_medians(limit)}
    cpu = {"rayfed": cpu_medians(probe.cpu, probe.seconds), "two_process": cpu_medians(limit.cpu, limit.seconds)}
    result |= {"phases_ms": phases, "cpu_ms": cpu}
    print(f"    where a round goes (median ms): rayfed {_phases(phases['rayfed'])}", flush=True)
    print(f"                                    2 processes {_phases(phases['two_process'])}", flush=True)
    print(f"    CPU per round (median ms): rayfed {_cpu(cpu['rayfed'])}", flush=True)
    print(f"                               2 processes {_cpu(cpu['two_process'])}", flush=True)
    for label, loop in zip(("plain", "plain channels-last", "2 processes"), probe.plain):
        pairs = ", ".join(f"{a:.4f}/{row['accuracy']:.4f}" for a, row in zip(loop.accuracies, history))
        print(f"    accuracy per round, {label} / rayfed: {pairs}", flush=True)
    print(
        f"    rayfed / plain channels-last: {rates[0] / rates[2]:.3f}, rayfed / 2 processes: {rates[0] / rates[3]:.3f}",
        flush=True,
    )
    if s.name == "s2" and not args.no_pss:
        peak, samples = rayfed_pss(s, args)
        result["rayfed_peak_pss_mb"] = sum(peak.values())
        result["rayfed_peak_pss_by_process_mb"] = peak
        parts = ", ".join(f"{name} {mb:.0f}" for name, mb in sorted(peak.items(), key=lambda kv: -kv[1]))
        print(
            f"    rayfed peak PSS (rayfed alone, a fresh driver): {sum(peak.values()):.0f} MB over {samples} "
            f"samples; per process name (MB): {parts}",
            flush=True,
        )
    return result


def rayfed_pss(s: Scenario, args: argparse.Namespace) -> tuple[dict[str, float], int]:
    """Peak PSS by process name of a run of rayfed alone on ``s``, in a fresh driver process
    (``--pss-of``), so that no plain loop's memory is counted, and the number of samples."""
    command = [
        sys.executable,
        __file__,
        "--pss-of",
        s.name,
        "--rounds",
        str(args.rounds),
        "--workers",
        str(args.workers),
        "--clients-per-call",
        str(args.clients_per_call),
        "--vectorize",
        args.vectorize,
    ]
    lines = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()
    report = json.loads(lines[-1])
    return report["peak"], report["samples"]


if __name__ == "__main__":
    sys.exit(main())
