"""Nodes that come and go (``ray.cluster_utils.Cluster`` on one box): a node joins mid-run, a worker node
leaves mid-round (while its calls are handed to it, and after they finished but before the server fetched
their contributions), a node's agent is killed, one node leaves and another joins, and every node leaves.
Each run ends with the results of a fixed pool, and of the one-process run, to the last digit; the last one
stops, waits ``engine.resource_wait_s``, and resumes.

The cluster runs in a separate Python process (the session's ``ray_cluster`` fixture may already have
initialised Ray in this one), which prints what it saw as JSON. Its head has no CPU, so the workers live on the
worker nodes alone, and Ray marks a node dead within about 1.5 s of its removal (health checks every 0.5 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
_FAST_NODE_DEATH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_timeout_ms": 500}


def _scenarios(out: Path) -> dict[str, Any]:
    """Run every scenario on one cluster; return, per scenario, its results and pool sizes."""
    import ray
    from ray.cluster_utils import Cluster

    from rayfed import RunConfig, WorkerError, run
    from rayfed.actors import ray_executor, worker_pool
    from rayfed.engine import Simulation
    from rayfed.engine.callbacks import Callback
    from tests.conftest import tiny_overrides

    def config(name: str, **extra: object) -> RunConfig:
        overrides = {
            "train.rounds": 4,
            "engine.clients_per_call": 2,  # 5 calls a round
            "engine.checkpoint_every": 1,
            "engine.round_timeout_s": 60.0,  # bounds every wait: a hang fails the test, it does not stall it
            **extra,
        }
        return RunConfig().override(tiny_overrides(out / name, **overrides))

    def numbers(result) -> dict[str, Any]:
        return {"accuracies": result.accuracies, "losses": [r["train_loss"] for r in result.history]}

    def received(result) -> list[float]:
        return [r["server_bytes_received"] for r in result.history]

    reference = run(config("reference"))  # in-process: a pool of one
    seen: dict[str, Any] = {"reference": numbers(reference), "reference_received": received(reference)}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": _FAST_NODE_DEATH},
    )
    events: dict[int, Any] = {}
    """round -> what to do to the cluster at that round's first worker call (mid-round)."""
    after: dict[int, Any] = {}
    """round -> what to do to the cluster after that round."""
    before_aggregation: dict[int, Any] = {}
    """round -> what to do once that round's calls are done, before the server fetches their contributions."""
    sizes: list[int] = []
    server_nodes: set[str] = set()
    """Where the ServerActor ran after each round (asked of the actor itself)."""
    sim: list[Simulation] = []

    class Sizes(Callback):
        def after_round(self, run_view, record, clients) -> bool:
            sizes.append(sim[-1].executor.pool.size)  # type: ignore[union-attr]
            server_nodes.add(ray.get(sim[-1].executor.server.node_id.remote()))  # type: ignore[union-attr]
            if (action := after.pop(record.round, None)) is not None:
                action()
            return False

    original_map, original_aggregate = worker_pool.WorkerPool.map, ray_executor.RayExecutor.aggregate

    def map_with_events(pool, method, chunks, args, *, round_index, **kwargs):
        action = events.pop(round_index, None) if method == "train" else None
        if action is None:
            return original_map(pool, method, chunks, args, round_index=round_index, **kwargs)
        dispatched, pending = args, [action]

        def args_then_event(i: int):
            if i == len(chunks) - 1 and pending:  # every worker has a call in flight: now the node leaves
                pending.pop()()  # once: the last batch's re-run (if it ran there) must not remove another node
            return dispatched(i)

        return original_map(pool, method, chunks, args_then_event, round_index=round_index, **kwargs)

    def aggregate_with_events(executor, ctx, contributions):
        if (action := before_aggregation.pop(ctx.round, None)) is not None:
            action()
        return original_aggregate(executor, ctx, contributions)

    worker_pool.WorkerPool.map = map_with_events
    ray_executor.RayExecutor.aggregate = aggregate_with_events

    def simulate(name: str, **extra: object) -> dict[str, Any]:
        sizes.clear()
        server_nodes.clear()
        simulation = Simulation(config(name, **{"engine.backend": "ray", **extra}), callbacks=[Sizes()])
        sim.append(simulation)
        result = simulation.run()
        executor = simulation.executor
        rerun = executor.contributions_rerun  # type: ignore[union-attr]
        on_head = server_nodes == {executor.server_node} == {cluster.head_node.node_id}  # type: ignore[union-attr]
        return {
            **numbers(result),
            "sizes": list(sizes),
            "rerun": rerun,
            "received": received(result),
            "on_head": on_head,
        }

    try:
        ray.init(address=cluster.address, logging_level="ERROR")  # before any worker node: the driver is the head's
        nodes = [cluster.add_node(num_cpus=1)]
        cluster.wait_for_nodes()

        def add() -> None:
            nodes.append(cluster.add_node(num_cpus=1))
            cluster.wait_for_nodes()

        def remove() -> None:
            node = nodes.pop()
            cluster.remove_node(node)
            while any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):  # Ray sees it gone
                time.sleep(0.1)

        def kill_an_agent() -> None:
            agent = next(iter(sim[-1].executor.pool.agents.values()))  # type: ignore[union-attr]
            os.kill(ray.get(agent.__ray_call__.remote(lambda _: os.getpid())), signal.SIGKILL)  # its node stays

        after[0] = add
        seen["join"] = simulate("join")
        events[1] = remove
        seen["leave_mid_round"] = simulate("leave_mid_round")
        add()
        events[1] = kill_an_agent
        seen["agent_killed"] = simulate("agent_killed")
        before_aggregation[1], after[2] = remove, add
        seen["leave_and_rejoin"] = simulate("leave_and_rejoin")
        before_aggregation[1] = lambda: [remove() for _ in list(nodes)]  # every node leaves
        try:
            simulate("all_leave", **{"engine.resource_wait_s": 2.0})
        except WorkerError as e:
            seen["all_leave_error"] = str(e)
        add()
        resumed = run(config("all_leave", **{"engine.backend": "ray"}), resume=True)
        seen["all_leave_resumed"] = numbers(resumed)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return seen


@pytest.mark.timeout(420)
def test_pool_follows_nodes_that_join_and_leave_with_the_numbers_of_a_fixed_pool(tmp_path) -> None:
    # Execute: the scenarios in their own process and cluster.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, __file__, str(tmp_path)], capture_output=True, text=True, env=env, cwd=REPO, timeout=400
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("ELASTIC ")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-4000:]
    seen = json.loads(lines[-1][len("ELASTIC ") :])
    reference = seen["reference"]
    # A node joins after round 0: the pool grows from the next round on.
    assert seen["join"]["sizes"] == [1, 2, 2, 2]
    # Round 0 ran its 5 calls on the one worker node: added up there, one call's bytes reached the server, not 5.
    assert 5 * seen["join"]["received"][0] == seen["reference_received"][0]
    # A node leaves while its worker trains: its clients re-run on the other worker in the same round.
    assert seen["leave_mid_round"]["sizes"] == [2, 1, 1, 1]
    # A node's agent is killed as its calls are handed to it: a new one runs them, and the pool keeps its workers.
    assert seen["agent_killed"]["sizes"] == [2, 2, 2, 2]
    # A node leaves after its worker's calls, before the server fetched them: those batches train again.
    assert seen["leave_and_rejoin"]["rerun"] >= 1
    assert seen["leave_and_rejoin"]["sizes"] == [2, 1, 1, 2]
    for name in ("join", "leave_mid_round", "agent_killed", "leave_and_rejoin", "all_leave_resumed"):
        assert {k: seen[name][k] for k in reference} == reference, name
    # The ServerActor stays on the driver's node (the head, which has no CPU), never on a node that may leave.
    assert all(seen[name]["on_head"] for name in ("join", "leave_mid_round", "agent_killed", "leave_and_rejoin"))
    # Every node leaves: the run waits engine.resource_wait_s, stops with its checkpoint, and resumes.
    error = seen["all_leave_error"]
    assert "round 1: no ClientWorker is left" in error and "engine.resource_wait_s=2 s" in error
    assert "rayfed run --resume" in error


if __name__ == "__main__":
    print("ELASTIC " + json.dumps(_scenarios(Path(sys.argv[1]))), flush=True)
