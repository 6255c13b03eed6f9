"""The serial cost of a round per worker: what the driver and the server spend as the pool grows.

Rounds with trivial client compute (2 clients a call, 4 samples each, one SGD step; FedAvg on the 4-layer CNN,
whose 2.3 MB model makes every broadcast and contribution an object-store object) on W workers with fractional
CPUs, W = 1, 2, 4, 8, 16 and ``--workers`` beyond, spread over ``--nodes`` Ray nodes of a
``ray.cluster_utils.Cluster`` on this box (each node has its own object store, as on a real cluster; the head,
which holds the driver and the ServerActor, runs no worker). Each worker makes one call a round. Per round,
after a warm-up round:

* ``driver_ms``: CPU time of the driver process over the round (dispatching calls, collecting reports, the
  round's files): the driver's serial work;
* ``server_ms``: wall time of the round's aggregation, from the driver's side (the server fetching and adding
  the calls' sums, or what folding left of them, and storing the next broadcast): the server's serial work;
* ``plain_ms``: the same two costs of a plain Ray loop on the same cluster (W actors each return a 2.3 MB array
  per call, an actor adds them; no rayfed), the floor that Ray itself sets on this machine;
* ``broadcast_fetches_per_node``: copies of the round's broadcast on nodes that ran workers, per such node
  (Ray's object locations; 1 = each node fetched it once, whatever its number of workers);
* ``to_server``: objects the server fetched from other nodes (W; one with ``engine.fold_sums``:
  ``rayfed.actors.folding``), and ``mb_per_node``: the most bytes a worker node moved (one broadcast, then
  either its workers' sums or one folded total in and one out).

``--folded`` measures each W again with ``engine.fold_sums=true``, to show what folding changes. A least-squares line
through ``driver_ms + server_ms`` against W gives the serial cost per added worker, beside the plain loop's. On
this 2-core box every process shares the cores, so the round's wall time grows with W by the workers' compute;
the serial costs are CPU time and the server's own step. The last line is ``serial_ms_per_worker=<fitted ms per
added worker> broadcast_fetches_per_node=<per round> workers_max=<largest W measured>``.

    python benchmarks/control_plane.py                    # W = 1..16 on 2 nodes
    python benchmarks/control_plane.py --workers 1,2,4,8,16,32 --nodes 4 --folded
"""

from __future__ import annotations

import argparse
import logging
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
from rayfed.actors import folding, ray_executor, worker_pool  # noqa: E402
from rayfed.engine.callbacks import Callback  # noqa: E402

CPUS_PER_WORKER = 0.05
ROUNDS = 5
"""Round 0 warms up; the last one evaluates every client; rounds 1..ROUNDS-2 are measured."""
MODEL_FLOATS = 2_300_000 // 4
"""The plain loop's array: as many float32 as the 4-layer CNN's parameters, about."""


class _Observed:
    """What the aggregation of each round saw: the calls' sums (refs), their nodes, and what the server got."""

    contributions: list[Any] = []
    nodes: list[str] = []
    folded: bool = False


def _observing_aggregate(original):
    def aggregate(executor, ctx, contributions):
        _Observed.contributions, _Observed.nodes = list(contributions), list(executor.calls_ran_on)
        _Observed.folded = False
        return original(executor, ctx, contributions)

    return aggregate


def _observing_fold(original):
    def fold(pool, runs, parts, nodes, round_index):
        _Observed.folded = True
        return original(pool, runs, parts, nodes, round_index)

    return fold


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
        executor = self.simulation.executor
        refs = [self._broadcast, *_Observed.contributions]
        where = ray.experimental.get_object_locations(refs)
        nodes = _Observed.nodes
        broadcast = where[self._broadcast]
        worker_nodes = set(nodes)
        copies = len(worker_nodes.intersection(broadcast["node_ids"]))
        part = max(where[ref]["object_size"] for ref in _Observed.contributions)
        server_node = executor.server_node  # type: ignore[union-attr]
        if _Observed.folded:
            runs = folding.runs_of(nodes)
            moved = {n: sum(1 + (r.start > 0) for r in runs if nodes[r.start] == n) for n in worker_nodes}
            to_server = int(nodes[runs[-1].start] != server_node)
        else:
            moved = {n: nodes.count(n) for n in worker_nodes}
            to_server = folding.fetches_unfolded(nodes, server_node)
        self.rows.append(
            {
                "round": record.round,
                "driver_ms": 1e3 * (cpu - self._cpu),
                "server_ms": 1e3 * record.aggregate_s,
                "round_s": record.round_s,
                "broadcast_fetches_per_node": copies / len(worker_nodes),
                "to_server": to_server,
                "mb_per_node": (broadcast["object_size"] + part * max(moved.values())) / 2**20,
            }
        )
        self._broadcast = executor.broadcast()  # type: ignore[union-attr]
        self._cpu = time.process_time()
        return False


def measure(workers: int, out: Path, *, fold: bool = False) -> dict[str, float]:
    """Median per-round costs of ``ROUNDS`` rounds of rayfed on ``workers`` workers (rounds 1..ROUNDS-2), with
    ``engine.fold_sums=fold``."""
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
            "engine.fold_sums": fold,
            "engine.eval_every": ROUNDS,
            "engine.checkpoint_every": 0,
            "engine.progress": False,
            "run_dir": str(out),
        }
    )
    simulation = Simulation(config)
    costs = _RoundCosts(simulation, workers)
    simulation.callbacks.append(costs)
    simulation.run()
    measured = [row for row in costs.rows if 1 <= row["round"] <= ROUNDS - 2]
    return {key: statistics.median(row[key] for row in measured) for key in measured[0] if key != "round"}


def measure_plain(workers: int, memory_mb: float) -> float:
    """Median serial ms (driver CPU + aggregation wall) of a plain Ray loop's rounds 1..ROUNDS-2 on ``workers``
    actors: each call reads the broadcast and returns an array of the model's size, an actor adds them."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote
    class Worker:
        @ray.method(num_returns=2)
        def train(self, broadcast: np.ndarray, clients: list[int]) -> tuple[np.ndarray, int]:
            return broadcast * np.float32(1.5), len(clients)

    @ray.remote(num_cpus=0)
    class Server:
        def __init__(self) -> None:
            self.model = np.zeros(MODEL_FLOATS, np.float32)

        def broadcast(self) -> np.ndarray:
            return self.model

        def aggregate(self, *parts: np.ndarray) -> None:
            total = parts[0].copy()
            for part in parts[1:]:
                total += part
            self.model = total / np.float32(len(parts))

    head = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    server = Server.options(scheduling_strategy=head).remote()  # type: ignore[attr-defined]
    pool = [Worker.options(num_cpus=CPUS_PER_WORKER).remote() for _ in range(workers)]  # type: ignore[attr-defined]
    broadcast = server.broadcast.remote()
    serial = []
    try:
        for round_index in range(ROUNDS):
            cpu = time.process_time()
            calls = [worker.train.remote(broadcast, [2 * k, 2 * k + 1]) for k, worker in enumerate(pool)]
            ray.get([reply for _, reply in calls])
            cpu = time.process_time() - cpu
            started = time.perf_counter()
            aggregated = server.aggregate.remote(*[part for part, _ in calls])
            broadcast = server.broadcast.remote()
            ray.get([aggregated, broadcast])
            if 1 <= round_index <= ROUNDS - 2:
                serial.append(1e3 * (cpu + time.perf_counter() - started))
    finally:
        for actor in [*pool, server]:
            ray.kill(actor)
        _wait_for_cpus_back(memory_mb)
    return statistics.median(serial)


def _available_mb() -> float:
    """The machine's available memory (``MemAvailable``), in MiB."""
    with open("/proc/meminfo") as meminfo:
        return next(float(line.split()[1]) / 1024 for line in meminfo if line.startswith("MemAvailable:"))


def _wait_for_cpus_back(memory_mb: float, timeout_s: float = 120.0) -> None:
    """Wait until every CPU of the cluster is free again and the machine has most of ``memory_mb`` available
    again: the killed actors' processes are gone, and the next measurement's memory check does not count them."""
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (
        ray.available_resources().get("CPU", 0.0) < ray.cluster_resources().get("CPU", 0.0) - 1e-6
        or _available_mb() < 0.95 * memory_mb
    ):
        time.sleep(0.5)


def _fit(rows: list[dict[str, float]], key: str) -> tuple[float, float]:
    slope, intercept = np.polyfit([r["workers"] for r in rows], [r[key] for r in rows], 1)
    return float(slope), float(intercept)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8,16", help="comma-separated pool sizes")
    parser.add_argument("--nodes", type=int, default=2, help="Ray nodes the workers spread over")
    parser.add_argument("--folded", action="store_true", help="also measure each W with engine.fold_sums=true")
    args = parser.parse_args(argv)
    sizes = [int(w) for w in args.workers.split(",")]

    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    per_node = math.ceil(max(sizes) * CPUS_PER_WORKER / args.nodes)  # Ray wants whole CPUs per node
    patched = [
        (ray_executor.RayExecutor, "aggregate", _observing_aggregate),
        (worker_pool.WorkerPool, "fold", _observing_fold),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    for owner, name, wrap in patched:
        setattr(owner, name, wrap(getattr(owner, name)))
    variants = {"default": False, **({"folded": True} if args.folded else {})}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    try:
        ray.init(address=cluster.address, logging_level=logging.WARNING)  # first: the driver attaches to the head
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=per_node, object_store_memory=200 * 2**20)
        cluster.wait_for_nodes()
        memory_mb = _available_mb()
        print(
            "variant   workers  driver_ms  server_ms  serial_ms  plain_ms  ratio  round_s  fetches/node  to_server"
            "  MB/node",
            flush=True,
        )
        with tempfile.TemporaryDirectory() as tmp:
            for workers in sorted(sizes, reverse=True):  # the largest pool first, while the box's memory is free
                costs_of = {}
                for name, fold in variants.items():
                    costs_of[name] = measure(workers, Path(tmp) / f"{name}{workers}", fold=fold)
                    _wait_for_cpus_back(memory_mb)
                plain = measure_plain(workers, memory_mb)
                for name, costs in costs_of.items():
                    row = {"workers": workers, **costs, "plain_ms": plain}
                    row["serial_ms"] = row["driver_ms"] + row["server_ms"]
                    rows[name].append(row)
                    print(
                        f"{name:8s}  {workers:7d}  {row['driver_ms']:9.1f}  {row['server_ms']:9.1f}  "
                        f"{row['serial_ms']:9.1f}  {plain:8.1f}  {row['serial_ms'] / plain:5.2f}  "
                        f"{row['round_s']:7.3f}  {row['broadcast_fetches_per_node']:12.2f}  "
                        f"{row['to_server']:9.0f}  {row['mb_per_node']:7.1f}",
                        flush=True,
                    )
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
        ray.shutdown()
        cluster.shutdown()
    for name, measured in rows.items():
        (slope, intercept), (driver, _), (server, _) = (
            _fit(measured, k) for k in ("serial_ms", "driver_ms", "server_ms")
        )
        split = f"driver {driver:.2f}, server {server:.2f}"
        print(f"fit {name}: serial_ms = {intercept:.1f} + {slope:.2f} x workers ({split})")
    plain_slope, plain_intercept = _fit(rows["default"], "plain_ms")
    print(f"fit plain Ray loop: serial_ms = {plain_intercept:.1f} + {plain_slope:.2f} x workers")
    slope, _ = _fit(rows["default"], "serial_ms")
    fetches = max(r["broadcast_fetches_per_node"] for r in rows["default"])
    print(f"serial_ms_per_worker={slope:.2f} broadcast_fetches_per_node={fetches:.2f} workers_max={max(sizes)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
