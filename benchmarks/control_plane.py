"""The serial cost of a round per worker: rayfed's driver and server beside a plain Ray loop's, in one run.

Rounds with trivial client compute (2 clients a call, 4 samples each, one SGD step; FedAvg on the 4-layer CNN,
whose 2.3 MB model makes every broadcast and contribution an object-store object) on W workers with fractional
CPUs, spread over ``--nodes`` Ray nodes of a ``ray.cluster_utils.Cluster`` on this box (each node has its own object
store, as on a real cluster; the head, which holds the driver and the ServerActor, runs no worker). Each worker
makes one call a round. For each W, largest first, rayfed runs ``ROUNDS`` rounds, then a plain Ray loop does the same
rounds on the same cluster (W actors each return a model-sized array per call, one actor adds them: no rayfed), the
floor that Ray itself sets on this machine. Per round, median over the rounds after the first:

* ``driver_ms``: CPU time of the driver process over the round (dispatching calls, collecting reports, the round's
  files; Ray's own threads in the driver included): the driver's serial work;
* ``server_ms``: wall time of the round's aggregation seen from the driver (the server fetching and adding what
  reached it, and storing the next broadcast): the server's serial work;
* ``plain_ms``: the same two costs of the plain loop;
* ``bcast/node``: copies of the round's broadcast on the nodes that ran workers, per such node (Ray's object
  locations: 1 = each node fetched it once, whatever its number of workers);
* ``server/node``: objects the server fetched from the worker nodes, per such node, and ``MB_to_server`` their size.

``--light`` replaces rayfed's ClientWorkers by light ones (no torch: each call returns a ready sum of the model's
size and its clients' reports), so that the box holds more of them and the slope is measured past 32; the
driver, the node agents and the server are rayfed's own either way. A least-squares line through
``driver_ms + server_ms`` against W gives rayfed's serial cost per added worker, beside the plain loop's. On this
2-core box every process shares the cores, so both bound the cost from above. The last line is
``serial_ms_per_worker=<rayfed> plain_ms_per_worker=<plain loop> server_fetches_per_node=<mean over W>
broadcast_fetches_per_node=<most over W> workers_max=<largest W>``.

    python benchmarks/control_plane.py --workers 1,2,4,8,16,32 --nodes 4
    python benchmarks/control_plane.py --workers 1,2,4,8,16,32,64,96 --nodes 4 --light
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from rayfed import RunConfig, Simulation
from rayfed.actors import worker_pool
from rayfed.engine.callbacks import Callback

CPUS_PER_WORKER = 0.05
ROUNDS = 5
"""Round 0 warms up; the last one evaluates every client; rounds 1..ROUNDS-2 are measured."""
MODEL_FLOATS = 2_300_000 // 4
"""The plain loop's array: as many float32 as the 4-layer CNN's parameters, about."""
SAMPLES_PER_CLIENT = 4


class _Sent:
    """The objects the server was handed for the last aggregation (``WorkerPool.merge_on_nodes``'s answer)."""

    objects: list[Any] = []


def _recording(original):
    def merge_on_nodes(pool, *args, **kwargs):
        spans, objects = original(pool, *args, **kwargs)
        _Sent.objects = list(objects)
        return spans, objects

    return merge_on_nodes


class _RoundCosts(Callback):
    """Per round: the driver's CPU time, the aggregation's wall time, and where the round's objects went."""

    def __init__(self, simulation: Simulation) -> None:
        self.simulation = simulation
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
        server_node = executor.server_node  # type: ignore[union-attr]
        worker_nodes = set(executor.calls_ran_on) - {server_node}  # type: ignore[union-attr]
        where = ray.experimental.get_object_locations([self._broadcast, *_Sent.objects])
        copies = len(worker_nodes.intersection(where[self._broadcast]["node_ids"]))
        fetched = [where[ref] for ref in _Sent.objects if set(where[ref]["node_ids"]) - {server_node}]
        self.rows.append(
            {
                "round": record.round,
                "driver_ms": 1e3 * (cpu - self._cpu),
                "server_ms": 1e3 * record.aggregate_s,
                "round_s": record.round_s,
                "broadcast_fetches_per_node": copies / max(1, len(worker_nodes)),
                "server_fetches_per_node": len(fetched) / max(1, len(worker_nodes)),
                "mb_to_server": sum(found["object_size"] for found in fetched) / 2**20,
            }
        )
        self._broadcast = executor.broadcast()  # type: ignore[union-attr]
        self._cpu = time.process_time()
        return False


def light_worker_class() -> Any:
    """A ClientWorker without torch: each train call returns a ready sum of the broadcast model's size (FedAvg's
    ``vector``) and its clients' reports; evaluation reports one correct answer in two per client."""
    import ray

    from rayfed.algorithms import WeightedSum
    from rayfed.execution.reports import ClientReport, EvalReport

    @ray.remote
    class LightWorker:
        def __init__(self, *args: Any) -> None:
            self.ready: np.ndarray | None = None

        @ray.method(num_returns=2)
        def train(self, broadcast: Any, ctx: Any, client_ids: list[int], states: dict) -> tuple[Any, Any]:
            if self.ready is None:
                self.ready = np.asarray(broadcast.vector, np.float32) * np.float32(SAMPLES_PER_CLIENT)
            size = int(self.ready.nbytes)
            reports = [ClientReport(cid, SAMPLES_PER_CLIENT, 1.0, 1, 1.0, size + 8, size, 0.0) for cid in client_ids]
            weight = float(SAMPLES_PER_CLIENT * len(client_ids))
            return WeightedSum(self.ready * np.float32(len(client_ids)), weight, len(client_ids)), (reports, {})

        def evaluate(self, broadcast: Any, ctx: Any, client_ids: list[int], states: dict) -> list[Any]:
            return [EvalReport(cid, 2, 1, 1.0) for cid in client_ids]

        def node_and_pid(self) -> tuple[str, int]:
            import os

            return ray.get_runtime_context().get_node_id(), os.getpid()

        def exit(self) -> None:
            ray.actor.exit_actor()

    return LightWorker


def measure(workers: int, out: Path) -> dict[str, float]:
    """Median per-round costs of rayfed's rounds 1..ROUNDS-2 on ``workers`` workers."""
    config = RunConfig().override(
        {
            "algorithm.name": "fedavg",
            "model.name": "cnn4",
            "data.dataset": "synthetic",
            "data.options": {"num_samples": 2 * workers * 6},
            "data.num_clients": 2 * workers,
            "data.partition": "iid",
            "train.rounds": ROUNDS,
            "train.batch_size": SAMPLES_PER_CLIENT,
            "engine.num_workers": workers,
            "engine.num_cpus_per_worker": CPUS_PER_WORKER,
            "engine.clients_per_call": 2,
            "engine.eval_every": ROUNDS,
            "engine.checkpoint_every": 0,
            "engine.progress": False,
            "run_dir": str(out),
        }
    )
    simulation = Simulation(config)
    costs = _RoundCosts(simulation)
    simulation.callbacks.append(costs)
    simulation.run()
    measured = [row for row in costs.rows if 1 <= row["round"] <= ROUNDS - 2]
    return {key: statistics.median(row[key] for row in measured) for key in measured[0] if key != "round"}


def measure_plain(workers: int) -> float:
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
    return statistics.median(serial)


def _available_mb() -> float:
    """The machine's available memory (``MemAvailable``), in MiB."""
    with open("/proc/meminfo") as meminfo:
        return next(float(line.split()[1]) / 1024 for line in meminfo if line.startswith("MemAvailable:"))


def _wait_for_cpus_back(memory_mb: float, timeout_s: float = 120.0) -> None:
    """Wait until every CPU of the cluster is free again and the machine has most of ``memory_mb`` available
    again: the ended actors' processes are gone, and the next measurement's memory check does not count them."""
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
    parser.add_argument("--light", action="store_true", help="light workers (no torch) in place of ClientWorkers")
    args = parser.parse_args(argv)
    sizes = [int(w) for w in args.workers.split(",")]

    import ray
    from ray.cluster_utils import Cluster

    started = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    per_node = math.ceil(max(sizes) * CPUS_PER_WORKER / args.nodes)  # Ray wants whole CPUs per node
    merge_on_nodes, worker_class = worker_pool.WorkerPool.merge_on_nodes, worker_pool.ClientWorker
    worker_pool.WorkerPool.merge_on_nodes = _recording(merge_on_nodes)  # type: ignore[method-assign]
    rows: list[dict[str, float]] = []
    variant = "light" if args.light else "rayfed"
    try:
        ray.init(address=cluster.address, logging_level=logging.WARNING)  # first: the driver attaches to the head
        if args.light:
            worker_pool.ClientWorker = light_worker_class()  # type: ignore[misc]
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=per_node, object_store_memory=200 * 2**20)
        cluster.wait_for_nodes()
        memory_mb = _available_mb()
        print(
            "variant  workers  driver_ms  server_ms  serial_ms  plain_ms  ratio  round_s  bcast/node  server/node"
            "  MB_to_server",
            flush=True,
        )
        with tempfile.TemporaryDirectory() as tmp:
            for workers in sorted(sizes, reverse=True):  # the largest pool first, while the box's memory is free
                costs = measure(workers, Path(tmp) / f"w{workers}")
                _wait_for_cpus_back(memory_mb)
                plain = measure_plain(workers)
                _wait_for_cpus_back(memory_mb)
                row = {"workers": workers, **costs, "plain_ms": plain}
                row["serial_ms"] = row["driver_ms"] + row["server_ms"]
                rows.append(row)
                print(
                    f"{variant:7s}  {workers:7d}  {row['driver_ms']:9.1f}  {row['server_ms']:9.1f}  "
                    f"{row['serial_ms']:9.1f}  {plain:8.1f}  {row['serial_ms'] / plain:5.2f}  {row['round_s']:7.3f}  "
                    f"{row['broadcast_fetches_per_node']:10.2f}  {row['server_fetches_per_node']:11.2f}  "
                    f"{row['mb_to_server']:12.1f}",
                    flush=True,
                )
    finally:
        worker_pool.WorkerPool.merge_on_nodes, worker_pool.ClientWorker = merge_on_nodes, worker_class  # type: ignore[method-assign,misc]
        ray.shutdown()
        cluster.shutdown()
    (slope, intercept), (driver, _), (server, _) = (_fit(rows, k) for k in ("serial_ms", "driver_ms", "server_ms"))
    plain_slope, plain_intercept = _fit(rows, "plain_ms")
    print(
        f"fit {variant}: serial_ms = {intercept:.1f} + {slope:.2f} x workers (driver {driver:.2f}, server {server:.2f})"
    )
    print(f"fit plain Ray loop: serial_ms = {plain_intercept:.1f} + {plain_slope:.2f} x workers")
    print(f"wall_s={time.monotonic() - started:.0f}")
    server_fetches = statistics.mean(r["server_fetches_per_node"] for r in rows)
    broadcast = max(r["broadcast_fetches_per_node"] for r in rows)
    print(
        f"serial_ms_per_worker={slope:.2f} plain_ms_per_worker={plain_slope:.2f} "
        f"server_fetches_per_node={server_fetches:.2f} broadcast_fetches_per_node={broadcast:.2f} "
        f"workers_max={max(sizes)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
