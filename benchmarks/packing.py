"""How busy a stack keeps its lanes, and whether packing changes a number (CPU and GPU alike).

A stack trains a call's clients as lanes of one model as many times as wide; a lane whose client has finished
idles while the others train, unless it takes its next client (``engine.pack_lanes``, :mod:`rayfed.train.lanes`).

* **Occupancy** of one call of the papers' MNIST protocol (20 clients, batch 10, one epoch) = useful client-steps /
  (lanes × stacked steps), for the clients' step counts that rayfed's own partitioners give on real MNIST
  (Dirichlet 0.1 and pathological, ``data.seed`` 1, the default: :data:`MNIST_STEPS`, recomputed with
  ``--data-root``), laid out one lane a client (before), packed (``engine.pack_lanes``), and in stacks of about
  equal step counts trained one after the other (the alternative docs/architecture.md weighs); and the bound no
  layout of one run's call passes without slack (a stack is at least as long as its longest client).
* **A pack of runs' call**: the same of one call of K = 1, 2, 4, 8 runs packed into one stack, each run's clients
  partitioned by its own ``data.seed`` (1 to K: :data:`MNIST_SEED_STEPS`), as ``rayfed.run_many`` merges them.
* **ATen operations per client-step** of one stacked call of that run's clients, packed and not, counted as
  ``benchmarks/step_overhead.py`` counts them (the launch proxy of the GPU path): printed above the last line.
* **packed_equal**: a run (FedAvg on tiny synthetic data, the stacked path) with its clients packed into lanes
  against the same run with one lane a client: 1 when every round's losses and accuracies agree within
  :data:`TOLERANCE`.

* **Runs sharing one stack** (``rayfed.run_many``, :mod:`packed_runs`): ``ops_k8_vs_k1``, the ATen operations per
  useful client-step of one call of each of 8 runs (seeds) merged into one stack over one run's call alone;
  ``packed_equal`` also asks that 3 runs of different seeds, learning rates and WDR lambdas (cwFedAvg), packed,
  give the rounds each gives alone (within :data:`packed_runs.RUNS_TOLERANCE`); ``cpu_k4_packed_vs_side_by_side``,
  the CPU wall time of 4 such runs packed in one process over the same 4 runs as processes side by side (the CPU's
  default, ``engine.vectorize=auto``).
* **The best layout, exactly**: each partition's busiest layout found by branch and bound within the default slack
  and others, the least slack that reaches 0.95, and the occupancy of K runs' clients packed jointly when the runs
  share one partition (the same 20 step counts K times: a table's seeds, which keep the preset's ``data.seed``).
  The exact search is run on one run's 20 clients only: on 40 it may not finish in minutes.

    python benchmarks/packing.py [--data-root DIR] [--rounds 3] [--clients 8] [--gpu] [--runs 8]

The last line: ``packing: occupancy_dirichlet=<x> occupancy_pathological=<x> ops_k8_vs_k1=<x> packed_equal=<0|1>
cpu_k4_packed_vs_side_by_side=<x> occupancy_k8_seeds_dirichlet=<x>``.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import packed_runs

from rayfed.config.run_config import RunConfig
from rayfed.engine.simulation import run
from rayfed.train.lanes import LANE_SLACK, equal_length_groups, occupancy, one_lane_each, packed_lanes

MNIST_SEED_STEPS = {
    "dirichlet": [
        [197, 37, 122, 190, 143, 464, 94, 95, 270, 300, 233, 282, 270, 160, 429, 408, 272, 423, 394, 457],
        [267, 496, 62, 188, 181, 267, 284, 438, 437, 368, 58, 270, 289, 104, 133, 69, 421, 145, 209, 553],
        [611, 27, 307, 201, 43, 59, 489, 292, 300, 454, 178, 154, 27, 120, 631, 409, 218, 272, 54, 396],
        [269, 471, 239, 196, 422, 356, 174, 59, 231, 268, 313, 146, 260, 67, 202, 268, 33, 542, 359, 365],
        [309, 255, 235, 304, 287, 267, 203, 387, 108, 458, 136, 363, 321, 318, 266, 254, 341, 85, 290, 54],
        [322, 265, 209, 132, 301, 6, 355, 54, 475, 295, 423, 17, 789, 240, 280, 247, 408, 185, 113, 124],
        [381, 337, 464, 102, 260, 6, 93, 90, 277, 279, 251, 218, 273, 557, 439, 96, 349, 190, 294, 284],
        [379, 152, 23, 114, 434, 550, 289, 304, 224, 405, 13, 139, 543, 381, 399, 291, 28, 120, 384, 67],
    ],
    "pathological": [
        [175, 98, 234, 599, 99, 154, 75, 730, 228, 218, 141, 397, 113, 175, 144, 629, 148, 142, 125, 616],
        [237, 183, 87, 599, 157, 159, 85, 656, 150, 130, 177, 526, 141, 107, 127, 686, 175, 87, 123, 647],
        [142, 158, 176, 631, 144, 177, 211, 526, 90, 95, 182, 617, 137, 110, 247, 568, 179, 110, 118, 625],
        [166, 67, 182, 691, 141, 95, 117, 704, 175, 223, 181, 403, 172, 114, 71, 704, 193, 152, 134, 553],
        [178, 149, 107, 672, 150, 132, 172, 604, 122, 111, 214, 536, 159, 191, 146, 565, 124, 164, 145, 599],
        [141, 185, 69, 711, 228, 128, 132, 570, 215, 73, 85, 611, 197, 115, 152, 597, 205, 158, 135, 533],
        [78, 239, 83, 707, 201, 169, 142, 545, 119, 155, 161, 548, 250, 138, 158, 514, 124, 204, 224, 480],
        [71, 203, 64, 768, 173, 192, 38, 655, 79, 155, 81, 668, 246, 150, 211, 455, 94, 131, 155, 653],
    ],
}
"""Each client's local steps in a round of the papers' MNIST protocol (20 clients, batch 10, one epoch, drop_last):
its training samples // 10, as ``make_partition`` splits real MNIST (α = 0.1 for Dirichlet), for ``data.seed`` 1 (the
default, PFLlib's) to 8: the runs of a pack whose partitions come from their own seeds."""
MNIST_STEPS = {partition: runs[0] for partition, runs in MNIST_SEED_STEPS.items()}
"""One run's clients: ``data.seed`` 1's."""
PACK_RUNS = (1, 2, 4, 8)
"""The runs K of the packs measured (the last one's Dirichlet occupancy ends the last line)."""
TOLERANCE = 1e-5
"""Relative agreement of a packed run's per-round numbers with its run unpacked: a lane's client trains on the same
samples with the same arithmetic, but a stack of another width may sum its grouped products in another order."""


def mnist_steps(data_root: str) -> dict[str, list[list[int]]]:
    """:data:`MNIST_SEED_STEPS` recomputed from real MNIST under ``data_root`` with rayfed's partitioners."""
    from rayfed.data import load_dataset, make_partition

    out: dict[str, list[list[int]]] = {}
    dataset = None
    for partition, runs in MNIST_SEED_STEPS.items():
        for seed in range(1, len(runs) + 1):
            data = (
                RunConfig()
                .override(
                    {
                        "data.dataset": "mnist",
                        "data.root": data_root,
                        "data.num_clients": 20,
                        "data.partition": partition,
                        "data.alpha": 0.1,
                        "data.seed": seed,
                    }
                )
                .data
            )
            dataset = dataset or load_dataset(data.dataset, data.root, seed=data.seed, options=data.options)
            sizes = make_partition(dataset.labels, dataset.num_classes, data).num_train()
            out.setdefault(partition, []).append([int(n) // 10 for n in sizes])
    return out


def layouts(steps: Sequence[int]) -> dict[str, dict[str, float]]:
    """Lanes, stacked steps and occupancy of each way to lay out one call's clients (module docstring)."""
    out = {}
    for name, lanes in (
        ("one lane a client", one_lane_each(steps)),
        (f"packed (slack {LANE_SLACK:.2f}, the default)", packed_lanes(steps)),
        ("packed (slack 0.30)", packed_lanes(steps, slack=0.3)),
    ):
        out[name] = {"lanes": len(lanes.clients), "stacked": lanes.stacked_steps, "occupancy": occupancy(lanes)}
    for tolerance in (0.05, 0.2):
        count, row = equal_stacks(steps, tolerance)
        out[f"{count} stacks of equal length (within {tolerance:.0%})"] = row
    return out


def equal_stacks(steps: Sequence[int], tolerance: float) -> tuple[int, dict[str, float]]:
    """(stacks, {lanes, stacked, occupancy}) of ``steps`` in stacks of equal length within ``tolerance`` trained one
    after the other (:func:`~rayfed.train.lanes.equal_length_groups`): the widest stack's lanes, the stacks' steps
    together."""
    groups = equal_length_groups(steps, tolerance)
    lane_steps = sum(len(group) * steps[group[0]] for group in groups)
    return len(groups), {
        "lanes": max(len(group) for group in groups),
        "stacked": sum(steps[group[0]] for group in groups),
        "occupancy": sum(steps) / lane_steps,
    }


def seeds_rows(runs: Sequence[Sequence[int]]) -> float:
    """Print one call of K runs packed into one stack (K in :data:`PACK_RUNS`), each run's clients from its own
    partition (``runs``: each run's clients' step counts): packed, one lane a client, and in stacks of equal length
    within 5 %; return the last K's packed occupancy."""
    packed = 1.0
    for k in PACK_RUNS:
        steps = [s for run in runs[:k] for s in run]
        lanes = packed_lanes(steps)
        packed = occupancy(lanes)
        count, equal = equal_stacks(steps, 0.05)
        print(
            f"  {k} run{'s' if k > 1 else ''} (data.seed 1-{k}) packed: {len(lanes.clients)} lanes "
            f"{lanes.stacked_steps} stacked steps  {packed:.3f}; one lane a client "
            f"{occupancy(one_lane_each(steps)):.3f}; {count} stacks of equal length (within 5%) "
            f"{equal['stacked']:.0f} stacked steps {equal['occupancy']:.3f}"
        )
    return packed


def tiny_config(run_dir: Path, rounds: int, clients: int, packed: bool, gpu: bool = False) -> RunConfig:
    """FedAvg on tiny synthetic data of unequal clients, stacked, its clients packed into lanes or not."""
    return RunConfig().override(
        {
            "data.dataset": "synthetic",
            "data.options": {"num_samples": 60 * clients},
            "data.num_clients": clients,
            "data.partition": "dirichlet",
            "data.alpha": 0.1,
            "model.name": "cnn4",
            "algorithm.name": "fedavg",
            "train.rounds": rounds,
            "train.batch_size": 4,
            "engine.backend": "local",
            "engine.vectorize": "on",
            "engine.clients_per_call": clients,  # one call, one stack
            "engine.pack_lanes": packed,
            "engine.progress": False,
            "engine.torch_threads": 1,
            "engine.num_gpus_per_worker": 1.0 if gpu else 0.0,
            "run_dir": str(run_dir),
        }
    )


def tiny_lanes(config: RunConfig) -> tuple[int, int]:
    """(lanes, clients) of the tiny run's first call, packed: its clients' steps as its partition gives them."""
    from rayfed.data import load_dataset, make_partition

    data = config.data
    dataset = load_dataset(data.dataset, data.root, seed=data.seed, options=data.options)
    sizes = make_partition(dataset.labels, dataset.num_classes, data).num_train()
    steps = [int(n) // config.train.batch_size for n in sizes]
    return len(packed_lanes(steps).clients), sum(1 for s in steps if s)


def ops_per_client_step(config: RunConfig) -> float:
    """ATen operations per client-step of one stacked training call over every client of ``config``'s first
    round, counted as ``benchmarks/step_overhead.py`` counts (the GPU path's launch proxy)."""
    from step_overhead import count

    counted = count(packed_runs.one_call(config)[1])
    return counted.ops / counted.client_steps


def agree(one: list[dict[str, Any]], other: list[dict[str, Any]]) -> bool:
    """Whether two runs' rounds agree in every loss and accuracy within :data:`TOLERANCE`."""
    keys = [k for k in one[0] if "loss" in k or "acc" in k]
    assert keys, sorted(one[0])
    return len(one) == len(other) and all(
        math.isclose(a[k], b[k], rel_tol=TOLERANCE, abs_tol=TOLERANCE) or (math.isnan(a[k]) and math.isnan(b[k]))
        for a, b in zip(one, other)
        for k in keys
        if isinstance(a[k], float)
    )


def no_slack_bound(steps: Sequence[int]) -> tuple[int, float]:
    """(fewest lanes, the most occupancy) of any layout of ``steps`` in as many stacked steps as its longest client:
    a stack is at least that long, so it needs ``ceil(total / longest)`` lanes, and its occupancy is at most
    ``total / (lanes x longest)``."""
    total, longest = sum(steps), max(steps)
    fewest = math.ceil(total / longest)
    return fewest, total / (fewest * longest)


def exact_rows(steps: Sequence[int]) -> None:
    """Print the busiest exact layouts of ``steps`` (:func:`packed_runs.best_occupancy`), the least slack reaching
    0.95, the bound without slack, and the occupancy of K runs of these same sizes packed jointly with the default
    slack."""
    fewest, bound = no_slack_bound(steps)
    print(
        f"  bound without slack: {sum(steps)} client-steps need >= {fewest} lanes of >= {max(steps)} steps (the "
        f"longest client): occupancy <= {bound:.3f}"
    )
    for slack in (LANE_SLACK, 0.1, 0.2, 0.3):
        best, lanes, stacked = packed_runs.best_occupancy(steps, slack)
        print(f"  exact, slack {slack:.2f}: {lanes} lanes {stacked} stacked steps  {best:.3f}")
    print(f"  least slack for 0.95, exact: {packed_runs.slack_for(steps, 0.95):.3f}")
    for runs in (2, 4, 8):
        joint = packed_lanes(list(steps) * runs)
        print(
            f"  {runs} runs of these same sizes packed jointly: {len(joint.clients)} lanes {joint.stacked_steps} "
            f"stacked steps  {occupancy(joint):.3f}"
        )


def runs_figures(args: argparse.Namespace, tmp: Path) -> tuple[float, bool, float]:
    """(ops_k8_vs_k1, packed runs equal, cpu_k4_packed_vs_side_by_side), printed with their parts."""
    seeds = [RunConfig().override(packed_runs.ops_overrides(tmp / f"ops-{k}", k)) for k in range(args.runs)]
    alone, merged = packed_runs.ops_k_vs_one(seeds)
    print(
        f"ATen ops per client-step: one run's call {alone:.1f}, {args.runs} runs' calls merged {merged:.1f} "
        f"({merged / alone:.3f}x)"
    )
    pack = [RunConfig().override(o) for o in packed_runs.tiny_pack(tmp / "equal", 3, args.rounds)]
    equal, _ = packed_runs.agree_figures(pack)
    print(
        f"packed runs: 3 runs (seeds, lr 0.01/0.02, WDR lambda 0.01/0.1/0.5) packed against each alone, {args.rounds} "
        f"rounds: {'equal' if equal else 'NOT equal'} within {packed_runs.RUNS_TOLERANCE:g}"
    )
    side = packed_runs.tiny_pack(tmp / "cpu", 4, args.rounds)
    for o in side:
        o["engine.vectorize"] = "auto"
    packed_s, side_s = packed_runs.cpu_packed_vs_side_by_side(side, tmp)
    print(f"CPU: 4 runs packed in one process {packed_s:.1f} s, as 4 processes side by side {side_s:.1f} s")
    return merged / alone, equal, packed_s / side_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", help="recompute the MNIST protocol's step counts from real MNIST here")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the packed_equal runs")
    parser.add_argument("--clients", type=int, default=8, help="clients of the packed_equal runs")
    parser.add_argument("--gpu", action="store_true", help="train the packed_equal runs on the GPU (CUDA graphs)")
    parser.add_argument("--runs", type=int, default=8, help="runs merged into one stack for ops_k8_vs_k1")
    args = parser.parse_args(argv)
    seeds = mnist_steps(args.data_root) if args.data_root else MNIST_SEED_STEPS
    occupancies, packs = {}, {}
    for partition, runs in seeds.items():
        counts = runs[0]
        print(f"MNIST protocol, {partition}: {len(counts)} clients, {sum(counts)} client-steps, longest {max(counts)}")
        for name, row in layouts(counts).items():
            print(f"  {name:44s} {row['lanes']:3.0f} lanes {row['stacked']:5.0f} stacked steps  {row['occupancy']:.3f}")
        occupancies[partition] = occupancy(packed_lanes(counts))
        exact_rows(counts)
        packs[partition] = seeds_rows(runs)
    with tempfile.TemporaryDirectory() as tmp:
        alone = run(tiny_config(Path(tmp) / "one-lane-each", args.rounds, args.clients, False, args.gpu)).history
        config = tiny_config(Path(tmp) / "packed", args.rounds, args.clients, True, args.gpu)
        packed = run(config).history
        ops = {
            packed: ops_per_client_step(tiny_config(Path(tmp) / "ops", 1, args.clients, packed, args.gpu))
            for packed in (False, True)
        }
        ops_ratio, runs_equal, cpu_ratio = runs_figures(args, Path(tmp))
    equal = agree(alone, packed) and runs_equal
    lanes, clients = tiny_lanes(config)
    print(
        f"ATen ops per client-step of that stacked call: one lane a client {ops[False]:.1f}, packed {ops[True]:.1f} "
        f"({ops[True] / ops[False]:.3f}x)"
    )
    print(
        f"packed_equal: a run with its {clients} clients packed into {lanes} lanes (every client sampled each round) "
        f"against one lane a client, {len(alone)} rounds"
    )
    print(
        f"packing: occupancy_dirichlet={occupancies['dirichlet']:.3f} "
        f"occupancy_pathological={occupancies['pathological']:.3f} ops_k8_vs_k1={ops_ratio:.3f} "
        f"packed_equal={int(equal)} cpu_k4_packed_vs_side_by_side={cpu_ratio:.2f} "
        f"occupancy_k{PACK_RUNS[-1]}_seeds_dirichlet={packs['dirichlet']:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
