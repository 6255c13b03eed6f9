"""The GPU path measured on whatever CUDA device this machine has; without one it says so and exits 0.

Four measurements, each on the first CUDA device:

* **Stacked against sequential client training.** One
  :class:`~rayfed.execution.client_runner.ClientRunner` per mode (``engine.vectorize=on`` / ``off``,
  ``engine.stack_size`` = the call's clients, so a call is one stack) trains the same
  clients from the same broadcast (FedAvg, 50 training samples per client, batch 10, one
  epoch, lr 0.005), the modes alternating so both see the same machine; for cnn4 on
  1x28x28 and resnet20 on 3x32x32 synthetic images and 20, 50, 100 and 200 clients per
  worker call. Reports seconds per client of each mode and their ratio (resnet20's BatchNorm
  statistics are stacked too, one per client).
* **Fractional GPUs.** Whole runs (``rayfed.run``, Ray backend, FedAvg, cnn4, 100 clients
  all trained every round, stacking as ``engine.vectorize=auto`` chooses): 4 ClientWorkers
  at ``engine.num_gpus_per_worker=0.25`` sharing the GPU against 1 worker at 1.0, the same
  clients and data; rounds per second (median after the warm-up round).
* **The papers' MNIST protocol.** cnn4, 20 clients (Dirichlet α = 0.1), batch 10, lr 0.005,
  one local epoch, every client trained and evaluated every round (docs/algorithms.md, "Data
  and evaluation" section), 1 worker at one GPU; MNIST from ``--data-root``, else the
  synthetic stand-in with MNIST's 70,000 samples; seconds per round (median after warm-up),
  with ``engine.vectorize`` auto (the default), on and off.
* **Yardsticks on the same protocol.** A plain PyTorch loop over the same clients' sizes (the
  partition's), data resident on the GPU, ``torch.optim.SGD(foreach=True)``: eager, and replaying
  one captured CUDA graph per step; training only, seconds per round.

    python benchmarks/gpu.py [--data-root DIR] [--rounds 4] [--repeats 3]
        [--clients 20,50,100,200] [--out FILE.json | --record]

The results go to ``--out``, or with ``--record`` to ``benchmarks/results/gpu.json`` with the commit measured
(nowhere without either). The last line holds
``mnist_round_s=<s> mnist_vs_plain_graph=<s / the graph-replayed plain loop's> vectorized_over_sequential_cnn4=<x>
vectorized_over_sequential_resnet20=<y> fractional_over_whole=<z> auto_vs_best=<auto's round / the
better of on and off>`` (ratios of speed > 1: stacked, resp. fractional, is faster; a stacking ratio is the
best over the call sizes; ratios of time < 1: rayfed is faster).

Without CUDA it prints ``gpu.py: found no CUDA GPU ...`` and exits with status 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RoundTimer, add_output_arguments, median_after_warmup, output_path, provenance  # noqa: E402

from rayfed import RunConfig, run  # noqa: E402
from rayfed.algorithms import RoundContext  # noqa: E402
from rayfed.data import load_dataset, make_partition  # noqa: E402
from rayfed.engine.problem_build import build_problem  # noqa: E402
from rayfed.execution.client_runner import ClientRunner  # noqa: E402
from rayfed.execution.server import Server  # noqa: E402
from rayfed.models import build_model  # noqa: E402
from rayfed.train.stacked_layers import model_unstackable  # noqa: E402

NO_GPU = "gpu.py: found no CUDA GPU (torch.cuda.is_available() is False); nothing measured"
MODELS = {"cnn4": (1, 28), "resnet20": (3, 32)}
"""Model -> (channels, image size) of its synthetic images."""
TRAIN_PER_CLIENT, SAMPLES_PER_CLIENT = 50, 60


METHOD_SETTINGS: dict[str, dict[str, Any]] = {"fedawa": {"train.momentum": 0.9}}
"""What a method's clients train with in its paper, where it is not FedAvg's (FedAWA's clients keep SGD momentum)."""


def client_config(model: str, clients: int, method: str = "fedavg") -> RunConfig:
    """``method`` on ``clients`` synthetic clients of 60 samples (50 to train), one GPU, batch 10, lr 0.005."""
    channels, size = MODELS[model]
    return RunConfig().override(
        {
            "data.options": {"num_samples": SAMPLES_PER_CLIENT * clients, "channels": channels, "image_size": size},
            "data.num_clients": clients,
            "data.partition": "iid",
            "data.train_fraction": TRAIN_PER_CLIENT / SAMPLES_PER_CLIENT,
            "model.name": model,
            "algorithm.name": method,
            "train.batch_size": 10,
            "train.lr": 0.005,
            "engine.num_gpus_per_worker": 1.0,
            "engine.stack_size": clients,
            **METHOD_SETTINGS.get(method, {}),
        }
    )


def stacked_against_sequential(model: str, clients: int, repeats: int, method: str = "fedavg") -> dict[str, Any]:
    """Seconds per client, sequential and stacked, on one call of ``clients`` clients of ``method`` (median of
    ``repeats``)."""
    base = client_config(model, clients, method)
    dataset = load_dataset(base.data.dataset, base.data.root, seed=base.data.seed, options=base.data.options)
    partition = make_partition(dataset.labels, dataset.num_classes, base.data)
    spec, initial = build_problem(base, dataset)
    broadcast = Server(base, spec, initial).broadcast()
    ids = list(range(clients))
    runners = {
        mode: ClientRunner(base.override({"engine.vectorize": mode}), spec, dataset, partition)
        for mode in ("off", "on")
    }
    seconds: dict[str, list[float]] = {mode: [] for mode in runners}
    for repeat in range(repeats + 1):  # the first pass builds the models and the CUDA kernels
        ctx = RoundContext(round=repeat, seed=0, lr=0.005, sampled=np.array(ids))
        for mode, runner in runners.items():
            torch.cuda.synchronize()
            started = time.perf_counter()
            runner.train(broadcast, ctx, ids)
            torch.cuda.synchronize()
            if repeat:
                seconds[mode].append((time.perf_counter() - started) / clients)
    sequential, stacked = (statistics.median(seconds[mode]) for mode in ("off", "on"))
    runner = runners["on"]
    return {
        "method": method,
        "model": model,
        "clients": clients,
        "sequential_s_per_client": sequential,
        "stacked_s_per_client": stacked,
        "ratio": sequential / stacked,
        "stacked": not model_unstackable(model, runner.model_for(model).module, base.train.drop_last),
    }


def seconds_per_round(overrides: dict[str, Any], run_dir: Path) -> tuple[float, list[dict[str, Any]]]:
    """Median wall-clock seconds per round (after the warm-up round) of a whole run, and its history."""
    timer = RoundTimer()
    config = RunConfig().override(
        {
            **overrides,
            "engine.backend": "ray",
            "engine.checkpoint_every": 0,
            "engine.progress": False,
            "run_dir": str(run_dir),
        }
    )
    history = run(config, callbacks=[timer]).history
    return median_after_warmup(timer.seconds), history


def fractional_against_whole(rounds: int, tmp: Path) -> dict[str, Any]:
    """4 workers at a quarter GPU each against 1 worker at a whole GPU, same clients: rounds per second."""
    workload = {
        "data.options": {"num_samples": SAMPLES_PER_CLIENT * 100},
        "data.num_clients": 100,
        "data.partition": "iid",
        "data.train_fraction": TRAIN_PER_CLIENT / SAMPLES_PER_CLIENT,
        "model.name": "cnn4",
        "algorithm.name": "fedavg",
        "train.batch_size": 10,
        "train.lr": 0.005,
        "train.rounds": rounds,
        "engine.eval_clients": "sampled",
    }
    out: dict[str, Any] = {}
    for name, workers, share in (("whole", 1, 1.0), ("fractional", 4, 0.25)):
        seconds, history = seconds_per_round(
            {**workload, "engine.num_workers": workers, "engine.num_gpus_per_worker": share}, tmp / name
        )
        out[name] = {
            "workers": workers,
            "num_gpus_per_worker": share,
            "rounds_per_s": 1 / seconds,
            "accuracies": [row["accuracy"] for row in history],
        }
    out["ratio"] = out["fractional"]["rounds_per_s"] / out["whole"]["rounds_per_s"]
    return out


def mnist_protocol(data_root: str | None, rounds: int, tmp: Path) -> dict[str, Any]:
    """The papers' MNIST round on one GPU, with each ``engine.vectorize``: seconds per round and its phases."""
    out: dict[str, Any] = {}
    for mode in ("auto", "on", "off"):
        seconds, history = seconds_per_round(
            {**mnist_overrides(data_root, rounds), "engine.vectorize": mode}, tmp / f"mnist-{mode}"
        )
        rows = history[1:] or history
        phases = {k: statistics.median(r[k] for r in rows) for k in ("train_s", "aggregate_s", "evaluate_s")}
        out[mode] = {"round_s": seconds, **phases, "accuracies": [row["accuracy"] for row in history]}
    return out


def mnist_overrides(data_root: str | None, rounds: int) -> dict[str, Any]:
    """The papers' MNIST protocol on one worker with a whole GPU."""
    data = (
        {"data.dataset": "mnist", "data.root": data_root}
        if data_root
        else {"data.dataset": "synthetic", "data.options": {"num_samples": 70_000}}
    )
    return {
        **data,
        "data.num_clients": 20,
        "data.partition": "dirichlet",
        "data.alpha": 0.1,
        "model.name": "cnn4",
        "algorithm.name": "fedavg",
        "train.batch_size": 10,
        "train.lr": 0.005,
        "train.local_epochs": 1,
        "train.rounds": rounds,
        "engine.num_workers": 1,
        "engine.num_gpus_per_worker": 1.0,
    }


def plain_loops(data_root: str | None, repeats: int) -> dict[str, float]:
    """Seconds per round of a plain loop over the protocol's clients (their partition's sizes), eager and
    with each step replayed from one captured CUDA graph; training only."""
    config = RunConfig().override(mnist_overrides(data_root, 1))
    dataset = load_dataset(config.data.dataset, config.data.root, seed=config.data.seed, options=config.data.options)
    sizes = make_partition(dataset.labels, dataset.num_classes, config.data).num_train().tolist()
    device = torch.device("cuda")
    torch.manual_seed(0)
    shape = dataset.input_shape
    data = [(torch.randn(n, *shape, device=device), torch.randint(0, 10, (n,), device=device)) for n in sizes]
    start, model = (build_model("cnn4", shape, dataset.num_classes).to(device) for _ in range(2))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.005, foreach=True)
    x_static = torch.zeros(10, *shape, device=device)
    y_static = torch.zeros(10, dtype=torch.long, device=device)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimiser.zero_grad(set_to_none=False)
        F.cross_entropy(model(x), y).backward()
        optimiser.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(x_static, y_static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimiser.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        step(x_static, y_static)

    def one_round(replay: bool) -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        for x, y in data:
            model.load_state_dict(start.state_dict())
            order = torch.randperm(len(x), device=device)
            for s in range(len(x) // 10):
                idx = order[s * 10 : (s + 1) * 10]
                if replay:
                    x_static.copy_(x[idx])
                    y_static.copy_(y[idx])
                    graph.replay()
                else:
                    step(x[idx], y[idx])
        torch.cuda.synchronize()
        return time.perf_counter() - started

    out = {}
    for name, replay in (("eager", False), ("graph", True)):
        one_round(replay)  # warm-up
        out[name] = statistics.median(one_round(replay) for _ in range(repeats))
    out["steps"] = float(sum(n // 10 for n in sizes))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=None, help="MNIST in torchvision's layout (default: synthetic)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per whole run; the first is warm-up")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per mode, after one warm-up")
    parser.add_argument("--clients", default="20,50,100,200", help="clients per worker call (comma-separated)")
    parser.add_argument(
        "--methods",
        default="fedavg",
        help="methods whose stacking is timed (comma-separated); all but fedavg on cnn4 only",
    )
    add_output_arguments(parser, "gpu.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_GPU, flush=True)
        return 0
    device = torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {device}", flush=True)
    stacking = []
    methods = args.methods.split(",")
    for method in methods:
        for model in MODELS if method == "fedavg" else ("cnn4",):
            for clients in (int(c) for c in args.clients.split(",")):
                row = stacked_against_sequential(model, clients, args.repeats, method)
                stacking.append(row)
                print(
                    f"{method}, {model:>8}, {clients:3d} clients per call: sequential "
                    f"{1000 * row['sequential_s_per_client']:.1f} ms/client, stacked "
                    f"{1000 * row['stacked_s_per_client']:.1f} ms/client, ratio {row['ratio']:.2f}"
                    f"{'' if row['stacked'] else ' (not stackable: trained sequentially)'}",
                    flush=True,
                )
    with tempfile.TemporaryDirectory(prefix="rayfed-gpu-") as tmp:
        fractional = fractional_against_whole(args.rounds, Path(tmp))
        print(
            f"fractional GPUs: 4 workers x 0.25 {fractional['fractional']['rounds_per_s']:.2f} rounds/s, "
            f"1 worker x 1.0 {fractional['whole']['rounds_per_s']:.2f} rounds/s",
            flush=True,
        )
        mnist = mnist_protocol(args.data_root, args.rounds, Path(tmp))
        for mode, row in mnist.items():
            print(
                f"MNIST protocol, engine.vectorize={mode}: {row['round_s']:.3f} s per round (train "
                f"{row['train_s']:.3f} s, aggregate {row['aggregate_s']:.3f} s, evaluate {row['evaluate_s']:.3f} s)",
                flush=True,
            )
    plain = plain_loops(args.data_root, args.repeats)
    print(
        f"plain loop over the same {plain['steps']:.0f} steps: eager {plain['eager']:.3f} s, CUDA graph "
        f"{plain['graph']:.3f} s per round",
        flush=True,
    )
    best = {
        model: max(r["ratio"] for r in stacking if r["model"] == model and r["method"] == "fedavg") for model in MODELS
    }
    best_method = {m: max(r["ratio"] for r in stacking if r["method"] == m) for m in methods if m != "fedavg"}
    auto = mnist["auto"]["round_s"]
    summary = {"mnist_round_s": auto, "mnist_vs_plain_graph": auto / plain["graph"]}
    summary |= {f"vectorized_over_sequential_{model}": ratio for model, ratio in best.items()}
    summary |= {f"vectorized_over_sequential_{method}": ratio for method, ratio in best_method.items()}
    summary |= {
        "fractional_over_whole": fractional["ratio"],
        "auto_vs_best": auto / min(mnist["on"]["round_s"], mnist["off"]["round_s"]),
    }
    out = output_path(args, "gpu.json")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    **provenance(),
                    "device": device,
                    "torch": torch.__version__,
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "stacking": stacking,
                    "fractional": fractional,
                    "mnist": mnist,
                    "plain": plain,
                    "summary": summary,
                },
                indent=2,
            )
        )
    print(" ".join(f"{k}={v:.3f}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
