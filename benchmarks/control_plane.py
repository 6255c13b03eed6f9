"""The serial cost of a round per worker: what the driver and the server spend as the pool grows.

Rounds with trivial client compute (2 clients a call, 4 samples each, one SGD step; FedAvg on the 4-layer CNN,
whose 2.3 MB model makes every broadcast and contribution an object-store object) on W workers with fractional
CPUs, W = 1, 2, 4, 8, 16 and ``--workers`` beyond, spread over ``--nodes`` Ray nodes of a
``ray.cluster_utils.Cluster`` on this box (each node has its own object store, as on a real cluster). Each
worker makes one call a round. Per round, after a warm-up round:

* ``driver_ms``: CPU time of the driver process over the round (dispatching calls, collecting reports, the
  round's files): the driver's serial work;
* ``server_ms``: wall time of the round's aggregation, from the driver's side (the server fetching and summing
  the W contributions and storing the next broadcast): the server's serial work;
* ``broadcast_fetches_per_node``: copies of the round's broadcast on nodes that ran workers, per such node
  (Ray's object locations; 1 = each node fetched it once, whatever its number of workers);
* ``contributions_per_worker`` and ``mb_per_node``: contribution objects per worker and the bytes a worker node
  sends and receives per round (one broadcast plus its workers' contributions, from the objects' sizes).

A least-squares line through ``driver_ms + server_ms`` against W gives the serial cost per added worker. On
this 2-core box the workers share the cores, so the round's wall time grows with W by the workers' compute;
the serial costs are CPU time and the server's own step, which do not. The last line is
``serial_ms_per_worker=<fitted ms per added worker> broadcast_fetches_per_node=<per round>
workers_max=<largest W measured>``.

    python benchmarks/control_plane.py                    # W = 1..16 on 2 nodes
    python benchmarks/control_plane.py --workers 1,2,4,8,16,32,48 --nodes 4
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rayfed import RunConfig, Simulation  # noqa: E402
from rayfed.actors import ray_executor  # noqa: E402
from rayfed.engine.callbacks import Callback  # noqa: E402

CPUS_PER_WORKER = 0.05
ROUNDS = 5
"""Round 0 warms up; the last one evaluates every client; rounds 1..ROUNDS-2 are measured."""


class _Observed:
    """What the aggregation of each round saw: its contributions (refs) and the nodes their calls ran on."""

    contributions: list[Any] = []
    nodes: list[str] = []


def _observing_aggregate(original):
    def aggregate(executor, ctx, contributions):
        _Observed.contributions, _Observed.nodes = list(contributions), list(executor.calls_ran_on)
        return original(executor, ctx, contributions)

    return aggregate


class _RoundCosts(Callback):
    """Per round: the driver's CPU time, the aggregation's wall time, and where the round's objects went."""

    def __init__(self, simulation: Simulation, workers: int) -> None:
        self.simulation, self.workers = simulation, workers
        self.rows: list[dict[str, float]] = []
        self._cpu = time.process_time()
        self._broadcast: Any = None

    def on_run_start(self, run) -> None:
        self._cpu = time.process_time()
        self._broadcast = self.simulation.executor.broadcast()  # type: ignore[union-attr]

    def after_round(self, run, record, clients) -> bool:
        import ray

        cpu = time.process_time()
        refs = [self._broadcast, *_Observed.contributions]
        where = ray.experimental.get_object_locations(refs)
        worker_nodes = set(_Observed.nodes)
        broadcast = where[self._broadcast]
        copies = len(worker_nodes.intersection(broadcast["node_ids"]))
        contribution_bytes = [where[ref]["object_size"] for ref in _Observed.contributions]
        per_node = {
            node: broadcast["object_size"]
            + sum(b for b, n in zip(contribution_bytes, _Observed.nodes, strict=True) if n == node)
            for node in worker_nodes
        }
        self.rows.append(
            {
                "round": record.round,
                "driver_ms": 1e3 * (cpu - self._cpu),
                "server_ms": 1e3 * record.aggregate_s,
                "round_s": record.round_s,
                "broadcast_fetches_per_node": copies / len(worker_nodes),
                "contributions_per_worker": len(contribution_bytes) / self.workers,
                "mb_per_node": max(per_node.values()) / 2**20,
            }
        )
        self._broadcast = self.simulation.executor.broadcast()  # type: ignore[union-attr]
        self._cpu = time.process_time()
        return False


def measure(workers: int, out: Path) -> dict[str, float]:
    """Median per-round costs of ``ROUNDS`` rounds on ``workers`` workers (rounds 1..ROUNDS-2)."""
    config = RunConfig().override(
        {
            "algorithm.name": "fedavg",
            "model.name": "cnn4",
            "data.dataset": "synthetic",
            "data.options": {"num_samples": 2 * workers * 6},
            "data.num_clients": 2 * workers,
            "data.partition": "iid",
            "train.rounds": ROUNDS,
            "train.batch_size": 4,
            "engine.num_workers": workers,
            "engine.num_cpus_per_worker": CPUS_PER_WORKER,
            "engine.clients_per_call": 2,
            "engine.eval_every": ROUNDS,
            "engine.checkpoint_every": 0,
            "engine.progress": False,
            "run_dir": str(out / f"w{workers}"),
        }
    )
    simulation = Simulation(config)
    costs = _RoundCosts(simulation, workers)
    simulation.callbacks.append(costs)
    simulation.run()
    measured = [row for row in costs.rows if 1 <= row["round"] <= ROUNDS - 2]
    return {key: statistics.median(row[key] for row in measured) for key in measured[0] if key != "round"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8,16", help="comma-separated pool sizes")
    parser.add_argument("--nodes", type=int, default=2, help="Ray nodes the workers spread over")
    args = parser.parse_args(argv)
    sizes = [int(w) for w in args.workers.split(",")]

    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    per_node = math.ceil(max(sizes) * CPUS_PER_WORKER / args.nodes)  # Ray wants whole CPUs per node
    original = ray_executor.RayExecutor.aggregate
    ray_executor.RayExecutor.aggregate = _observing_aggregate(original)  # type: ignore[method-assign]
    rows = []
    try:
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=per_node, object_store_memory=200 * 2**20)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="WARNING")
        print("workers  driver_ms  server_ms  serial_ms  round_s  fetches/node  contrib/worker  MB/node", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            for workers in sizes:
                row = {"workers": workers, **measure(workers, Path(tmp))}
                row["serial_ms"] = row["driver_ms"] + row["server_ms"]
                rows.append(row)
                print(
                    f"{workers:7d}  {row['driver_ms']:9.1f}  {row['server_ms']:9.1f}  {row['serial_ms']:9.1f}  "
                    f"{row['round_s']:7.3f}  {row['broadcast_fetches_per_node']:12.2f}  "
                    f"{row['contributions_per_worker']:14.2f}  {row['mb_per_node']:7.1f}",
                    flush=True,
                )
    finally:
        ray_executor.RayExecutor.aggregate = original  # type: ignore[method-assign]
        ray.shutdown()
        cluster.shutdown()
    slope, intercept = np.polyfit([r["workers"] for r in rows], [r["serial_ms"] for r in rows], 1)
    print(f"fit: serial_ms = {intercept:.1f} + {slope:.2f} x workers")
    fetches = max(r["broadcast_fetches_per_node"] for r in rows)
    print(f"serial_ms_per_worker={slope:.2f} broadcast_fetches_per_node={fetches:.2f} workers_max={max(sizes)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
