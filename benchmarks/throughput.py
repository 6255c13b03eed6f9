"""Client updates per second: rayfed on Ray against a plain single-process PyTorch loop.

Two workloads (FedAvg, the papers' 4-layer CNN on 1x28x28 synthetic images, 50 training
and 10 test samples per client, batch 10, one local epoch, SGD lr 0.005):

* S1: 100 clients, all of them trained every round;
* S2: 1,000 clients, 100 sampled per round.

Every round trains the sampled clients, aggregates them (sample-size weighted average)
and evaluates the new global model on the sampled clients' test sets
(``engine.eval_clients="sampled"``). The plain loop does exactly that work, as one would
write it with PyTorch alone: the data pre-loaded as normalised tensors, one model,
``torch.optim.SGD``, ``parameters_to_vector`` and a running weighted sum, torch's default
number of threads. It draws the same clients and the same mini-batch orders as rayfed, so
both reach the same accuracy in every round (printed as a check). For reference the same
loop also runs with the model converted to channels-last (``model.to(memory_format=
torch.channels_last)``), the one change a PyTorch expert would make for this CNN on CPU;
its updates per second and rayfed's ratio to it are printed too. The last line compares
with the plain loop, as the workload is specified.

The loops run interleaved, round by round: rayfed's round t, then each plain loop's round t
(in the driver, while rayfed's workers wait), then rayfed's round t+1, and so on, so a
drift in the machine's speed (the box is shared) weighs on all alike. rayfed starts and
afterwards stops a private local Ray, as ``rayfed.run`` does for users. The first round of
each (workers start, models are built) is excluded; the result is the median over the
other rounds. The last line is::

    throughput_ratio_s1=<rayfed / plain on S1> throughput_ratio_s2=<rayfed / plain on S2>

rayfed's layout here: one ClientWorker per core with one torch thread each, each worker
call summing its clients (2 calls per worker per round), the flat-vector SGD step,
convolution kernels stored channels-last in the flat vector (:mod:`rayfed.flat`; on this
CPU torch's NCHW ``max_pool2d`` is ~13x slower than the channels-last one, and a cnn4 step
at batch 10 takes 6.5 ms instead of 8.9 ms), workers keeping freed buffers in their heap
(no page faults per step). Also tried on the 2-core box, per client and one thread unless
said: ``torch.compile`` 0.74x, stacked clients with ``torch.func.vmap`` 0.22-0.68x
(``benchmarks/vectorize_cpu.py``), ``torch.jit.trace``, autograd-owned gradients with a
foreach update, and pinning each worker to a core: all within the noise (+-5 %) or slower.
1, 2 or 5 calls per worker per round: the same within the noise. A reshape-and-max pooling
was no faster than ``max_pool2d``. Kept: only what is described above.

Run: ``python benchmarks/throughput.py`` (about 2-3 minutes on 2 cores);
``--vectorize on`` trains the clients of a worker call stacked (``engine.vectorize``).
Checkpoints are off (``engine.checkpoint_every=0``): the plain loop writes none either;
the metrics files rayfed writes every round are included in its round times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RoundTimer, median_after_warmup  # noqa: E402

from rayfed import RunConfig, run  # noqa: E402
from rayfed.algorithms.fedprox import flatten_logically  # noqa: E402
from rayfed.data import load_dataset, make_partition, normalize_batch  # noqa: E402
from rayfed.flat import FlatModel  # noqa: E402
from rayfed.models import build_model  # noqa: E402
from rayfed.problem import build_problem
from rayfed.seeding import client_seed, sample_clients  # noqa: E402

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
    return RunConfig().override({
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
    })


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
        config, model, batch = self.config, self.model, self.config.train.batch_size
        started = time.perf_counter()
        sampled = sample_clients(config.seed, t, config.data.num_clients, config.engine.join_ratio)
        total, weight = torch.zeros_like(self.global_vector), 0
        for cid in sampled.tolist():
            self._load(self.global_vector)
            model.train()
            x, y = self.train[cid]
            n = len(y)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(client_seed(config.seed, t, cid)))
            for start in range(0, n - n % batch, batch):  # drop_last, as the papers' loaders
                idx = order[start : start + batch]
                self.optimizer.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                self.optimizer.step()
            total.add_(self._read(), alpha=n)
            weight += n
        self.global_vector = total / weight
        self._load(self.global_vector)
        model.eval()
        correct = count = 0
        with torch.no_grad():
            for cid in sampled.tolist():
                x, y = self.test[cid]
                logits = model(x)
                F.cross_entropy(logits, y, reduction="sum")
                correct += int((logits.argmax(dim=1) == y).sum())
                count += len(y)
        self.seconds.append(time.perf_counter() - started)
        self.accuracies.append(correct / count)


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


# --- both, interleaved round by round -----------------------------------------------------------------


class Interleaved(RoundTimer):
    """Times rayfed's rounds and runs the plain loop's round t right after rayfed's round t.

    The plain round runs in the driver while rayfed's workers wait for their next call,
    and is left out of rayfed's round times; so both see the same state of the machine.
    """

    def __init__(self, *plain: PlainLoop) -> None:
        super().__init__()
        self.plain = plain

    def after_round(self, sim, record, clients) -> bool:
        super().after_round(sim, record, clients)
        for loop in self.plain:
            loop.round(record.round)
        self._last = time.perf_counter()
        return False


def breakdown(history: list[dict]) -> str:
    """Median seconds per phase over the measured rounds (from rayfed's own round records)."""
    rows = history[1:] or history
    med = {k: statistics.median(r[k] for r in rows) for k in ("train_s", "aggregate_s", "evaluate_s", "round_s")}
    return (f"train {med['train_s']:.3f} s, aggregate {med['aggregate_s']:.3f} s, "
            f"evaluate {med['evaluate_s']:.3f} s, round {med['round_s']:.3f} s")


def _times(seconds: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per measurement; the first is warm-up")
    parser.add_argument("--workers", type=int, default=0, help="ClientWorker actors (0 = one per CPU)")
    parser.add_argument("--clients-per-call", type=int, default=0,
                        help="engine.clients_per_call (0 = 2 calls per worker)")
    parser.add_argument("--vectorize", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--scenarios", default="s1,s2", help="comma-separated: s1, s2")
    parser.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON here")
    args = parser.parse_args(argv)
    scenarios = [SCENARIOS[name.strip()] for name in args.scenarios.split(",") if name.strip()]
    print(f"torch {torch.__version__}, default threads {torch.get_num_threads()}, "
          f"rounds {args.rounds} (first excluded)",
          flush=True)

    results: dict[str, dict[str, float | bool]] = {}
    with tempfile.TemporaryDirectory(prefix="rayfed-throughput-") as tmp:
        for s in scenarios:
            config = scenario_config(s, args, Path(tmp) / s.name)
            probe = Interleaved(PlainLoop(config), PlainLoop(config, channels_last=True))
            history = run(config, callbacks=[probe]).history
            engine = s.sampled_per_round / median_after_warmup(probe.seconds)
            plain, expert = (s.sampled_per_round / median_after_warmup(loop.seconds) for loop in probe.plain)
            gap = max(abs(a - row["accuracy"]) for loop in probe.plain for a, row in zip(loop.accuracies, history))
            results[s.name] = {"plain_updates_per_s": plain, "plain_channels_last_updates_per_s": expert,
                               "engine_updates_per_s": engine, "max_accuracy_difference": gap}
            for label, loop, rate in (("plain PyTorch loop:      ", probe.plain[0], plain),
                                      ("plain, channels-last:    ", probe.plain[1], expert),
                                      ("rayfed on Ray:           ", probe, engine)):
                print(f"{s.name.upper()} {label}{rate:6.1f} updates/s  (rounds {_times(loop.seconds)} s)", flush=True)
            print(f"    rayfed phases (median): {breakdown(history)}", flush=True)
            for label, loop in (("plain", probe.plain[0]), ("plain channels-last", probe.plain[1])):
                pairs = ", ".join(f"{a:.4f}/{row['accuracy']:.4f}" for a, row in zip(loop.accuracies, history))
                print(f"    accuracy per round, {label} / rayfed: {pairs}", flush=True)
            print(f"    rayfed / plain channels-last: {engine / expert:.3f}", flush=True)
    for name, r in results.items():
        r["ratio"] = r["engine_updates_per_s"] / r["plain_updates_per_s"]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        arguments = {k: str(v) for k, v in vars(args).items()}
        args.out.write_text(json.dumps({"args": arguments, "results": results}, indent=2))
    print(" ".join(f"throughput_ratio_{name}={r['ratio']:.3f}" for name, r in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
