"""Runs that share one stack (``rayfed.run_many``), measured for ``benchmarks/packing.py``.

* :func:`ops_k_vs_one`: ATen operations per useful client-step of one training call of each of K runs, their stacks
  merged into one (:class:`~rayfed.execution.stack_merger.StackMerger`, the runs' threads as ``run_many`` runs them),
  over the same of one run alone, counted as ``benchmarks/step_overhead.py`` counts (``torch.profiler``, every
  ``aten::`` event) in every thread.
* :func:`packed_runs_agree`: K runs of different seeds, learning rates and WDR lambdas (cwFedAvg), packed by
  ``run_many``, against each run alone: their rounds' losses and accuracies.
* :func:`cpu_packed_vs_side_by_side`: the wall time of K runs packed in one process over the same K runs as K
  processes side by side (``python -m rayfed run``, the CPU's default: ``engine.vectorize=auto``, one client at a
  time).
* :func:`exact_lanes`: the busiest layout of one call's clients over a given number of lanes within a number of
  stacked steps, found exactly (branch and bound), to measure how far MULTIFIT (:mod:`rayfed.train.lanes`) is from
  the best, and what slack one call needs for an occupancy.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from step_overhead import count

import rayfed
from rayfed.algorithms import RoundContext
from rayfed.config.run_config import RunConfig
from rayfed.data import load_dataset, make_partition
from rayfed.engine.problem_build import build_problem
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.server import Server
from rayfed.execution.stack_merger import StackMerger

REPO = Path(__file__).resolve().parents[1]
RUNS_TOLERANCE = 1e-3
"""Relative agreement of a packed run's losses with its run alone (accuracies: within 0.02), the stacked path's
run-level tolerance (tests/train/test_stacked.py): a stack that holds other runs' clients is a stack of another width,
which sums its grouped products in another order, and training carries the last bits' difference on from round to
round (about 1e-8 relative after a round at lr 0.01; 1.5e-5 in round 1 of one run at lr 0.03, with the per-lane rates
and losses off as well, where one test sample of the global model's changed its class)."""


def one_call(config: RunConfig) -> tuple[ClientRunner, Callable[[], int]]:
    """A runner of ``config`` and one training call over every client of its first round (which returns its
    client-steps)."""
    data = config.data
    dataset = load_dataset(data.dataset, data.root, seed=data.seed, options=data.options)
    partition = make_partition(dataset.labels, dataset.num_classes, data)
    spec, initial = build_problem(config, dataset)
    broadcast = Server(config, spec, initial).broadcast()
    runner = ClientRunner(config.override({"engine.stack_size": data.num_clients}), spec, dataset, partition)
    ids = list(range(data.num_clients))
    ctx = RoundContext(round=0, seed=config.seed, lr=config.train.lr, sampled=np.arange(data.num_clients))
    return runner, lambda: sum(report.steps for report in runner.train(broadcast, ctx, ids).reports)


def _merged_calls(configs: Sequence[RunConfig]) -> Callable[[], int]:
    """One training call of each of ``configs``' runs at once, each in a thread as ``run_many`` runs them, their
    stacks merged; returns their client-steps."""
    calls = [one_call(config) for config in configs]

    def work() -> int:
        merger = StackMerger()
        merger.expect(len(calls))
        steps = [0] * len(calls)

        def one(index: int) -> None:
            runner, call = calls[index]
            with merger.turn():
                runner.merger = merger
                steps[index] = call()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert merger.merged == len(calls), merger.merged  # every run's stack trained in the one merged stack
        return sum(steps)

    return work


def ops_k_vs_one(configs: Sequence[RunConfig]) -> tuple[float, float]:
    """(ATen ops per client-step of ``configs[0]``'s call alone, of the K calls merged)."""
    alone = count(one_call(configs[0])[1], all_threads=True)
    merged = count(_merged_calls(configs), all_threads=True)
    return alone.ops / alone.client_steps, merged.ops / merged.client_steps


def agree(one: list[dict[str, Any]], other: list[dict[str, Any]]) -> bool:
    """Whether two runs' rounds agree: losses within :data:`RUNS_TOLERANCE` (relative), accuracies within 0.02."""
    keys = [k for k in one[0] if ("loss" in k or "acc" in k) and isinstance(one[0][k], float)]
    if len(one) != len(other) or not keys:
        return False
    for a, b in zip(one, other):
        for key in keys:
            tolerance = {"abs_tol": 0.02} if "acc" in key else {"rel_tol": RUNS_TOLERANCE}
            if not (math.isclose(a[key], b[key], **tolerance) or (math.isnan(a[key]) and math.isnan(b[key]))):
                return False
    return True


def agree_figures(configs: Sequence[RunConfig]) -> tuple[bool, float]:
    """Whether every run of ``configs``, packed by ``run_many``, gives the rounds it gives alone; and the packed runs'
    wall time."""
    started = time.perf_counter()
    packed = rayfed.run_many(configs)
    seconds = time.perf_counter() - started
    alone = [rayfed.run(config.override({"run_dir": f"{config.run_dir}-alone"})) for config in configs]
    return all(agree(p.history, a.history) for p, a in zip(packed, alone)), seconds


def cpu_packed_vs_side_by_side(overrides: Sequence[dict[str, Any]], root: Path) -> tuple[float, float]:
    """(seconds of the runs ``overrides`` packed by ``run_many`` in one process, seconds of the same runs as processes
    side by side, each with the CPU's default ``engine.vectorize=auto``); each timed from its process's start."""
    script = (
        "import json, sys, rayfed; rayfed.run_many([rayfed.RunConfig().override(o) for o in json.loads(sys.argv[1])])"
    )
    packed = [{**o, "engine.vectorize": "on", "run_dir": str(root / f"packed-{i}")} for i, o in enumerate(overrides)]
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", script, json.dumps(packed)], cwd=REPO, check=True, capture_output=True)
    packed_s = time.perf_counter() - started
    started = time.perf_counter()
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "rayfed", "run", "--quiet", *_arguments({**o, "run_dir": str(root / f"side-{i}")})],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i, o in enumerate(overrides)
    ]
    assert all(process.wait() == 0 for process in processes)
    return packed_s, time.perf_counter() - started


def _arguments(overrides: dict[str, Any]) -> list[str]:
    return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items()]


# --- the best layout of one call, exactly -------------------------------------------------------------------------
def _fits(steps: Sequence[int], lanes: int, capacity: int) -> bool:
    """Whether ``steps`` (longest first) fit ``lanes`` lanes of ``capacity`` steps each (depth-first, lanes of equal
    load tried once, a failed (client, loads) state remembered)."""
    loads = [0] * lanes
    failed: set[tuple[int, tuple[int, ...]]] = set()
    rest = [sum(steps[i:]) for i in range(len(steps) + 1)]

    def place(i: int) -> bool:
        if i == len(steps):
            return True
        state = (i, tuple(sorted(loads)))
        if state in failed or rest[i] > lanes * capacity - sum(loads):
            return False
        tried: set[int] = set()
        for lane in range(lanes):
            if loads[lane] in tried or loads[lane] + steps[i] > capacity:
                continue
            tried.add(loads[lane])
            loads[lane] += steps[i]
            if place(i + 1):
                return True
            loads[lane] -= steps[i]
        failed.add(state)
        return False

    return place(0)


@functools.cache
def exact_lanes(steps: tuple[int, ...], lanes: int) -> int:
    """The fewest stacked steps ``steps`` take over ``lanes`` lanes, each lane training its clients one after the
    other: the smallest capacity that :func:`_fits` (a bisection)."""
    ordered = sorted((s for s in steps if s > 0), reverse=True)
    low, high = max(ordered[0], math.ceil(sum(ordered) / lanes)), sum(ordered)
    while low < high:
        middle = (low + high) // 2
        if _fits(ordered, lanes, middle):
            high = middle
        else:
            low = middle + 1
    return low


def best_occupancy(steps: Sequence[int], slack: float) -> tuple[float, int, int]:
    """(occupancy, lanes, stacked steps) of the busiest exact layout of ``steps`` within ``(1 + slack)`` times the
    longest client's steps."""
    active = tuple(s for s in steps if s > 0)
    longest, total = max(active), sum(active)
    best = (total / (len(active) * longest), len(active), longest)
    for lanes in range(max(1, math.ceil(total / ((1 + slack) * longest))), len(active)):
        stacked = exact_lanes(active, lanes)
        if stacked <= (1 + slack) * longest and total / (lanes * stacked) > best[0]:
            best = (total / (lanes * stacked), lanes, stacked)
    return best


def slack_for(steps: Sequence[int], target: float) -> float:
    """The least slack whose exact layout reaches ``target`` occupancy: over each lane count's fewest stacked steps."""
    active = tuple(s for s in steps if s > 0)
    longest, total = max(active), sum(active)
    slacks = [
        exact_lanes(active, lanes) / longest - 1
        for lanes in range(1, len(active) + 1)
        if total / (lanes * exact_lanes(active, lanes)) >= target
    ]
    return min(slacks, default=math.inf)


def tiny_overrides(run_dir: Path, seed: int, lr: float, wdr_lambda: float, rounds: int) -> dict[str, Any]:
    """A tiny cwFedAvg run of 8 clients on synthetic data, stacked (its clients in one call)."""
    return {
        "data.dataset": "synthetic",
        "data.options": {"num_samples": 480},
        "data.num_clients": 8,
        "data.partition": "dirichlet",
        "data.alpha": 0.1,
        "model.name": "cnn4",
        "algorithm.name": "cwfedavg",
        "algorithm.params.wdr_lambda": wdr_lambda,
        "train.rounds": rounds,
        "train.batch_size": 4,
        "train.lr": lr,
        "seed": seed,
        "engine.backend": "local",
        "engine.vectorize": "on",
        "engine.clients_per_call": 8,
        "engine.progress": False,
        "engine.torch_threads": 1,
        "run_dir": str(run_dir),
    }


def ops_overrides(run_dir: Path, seed: int) -> dict[str, Any]:
    """A FedAvg run of 8 clients (about 30 steps each, as the ops of a step outweigh a client's own), for the ops."""
    overrides = {**tiny_overrides(run_dir, seed, 0.01, 0.0, 1), "algorithm.name": "fedavg", "engine.pack_lanes": True}
    del overrides["algorithm.params.wdr_lambda"]
    return {**overrides, "data.options": {"num_samples": 1200}}


def tiny_pack(root: Path, runs: int, rounds: int) -> list[dict[str, Any]]:
    """``runs`` tiny runs that differ in their seeds, learning rates and WDR lambdas."""
    return [
        tiny_overrides(root / f"run-{k}", k, (0.01, 0.02)[k % 2], (0.01, 0.1, 0.5)[k % 3], rounds) for k in range(runs)
    ]
