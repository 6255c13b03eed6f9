"""Two Ray nodes (head + one worker node, 1 CPU each): the ClientWorkers land on both, rounds complete.

The cluster (``ray.cluster_utils.Cluster``) runs in a separate Python process, since the
session's ``ray_cluster`` fixture may already have initialised Ray in this one; that
process shuts the cluster down in a ``finally`` and prints what it saw as JSON.

Each node also declares one *logical* GPU and the workers ask for half of one
(``engine.num_gpus_per_worker=0.5``): Ray schedules them and hands each a GPU id, and a
worker trains on CUDA if torch sees one, else on the CPU (this machine has no GPU, so the
CUDA branch itself is not exercised here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayfed.engine import Simulation
from rayfed.engine.callbacks import Callback

REPO = Path(__file__).resolve().parents[2]


def _placement(actor) -> tuple[list[str], str]:
    """Inside a ClientWorker: the GPU ids Ray assigned it and the device its runner trains on."""
    import ray

    return [str(g) for g in ray.get_gpu_ids()], str(actor.runner.device)


class NodeRecorder(Callback):
    """A callback that asks every ClientWorker of ``simulation`` where it runs, at the start and after each round."""

    def __init__(self) -> None:
        self.simulation: Simulation | None = None
        self.nodes: set[str] = set()
        self.placements: list[tuple[list[str], str]] = []

    def _record(self) -> None:
        import ray

        workers = self.simulation.executor.pool.workers  # type: ignore[union-attr]
        self.nodes.update(node for node, _ in ray.get([w.node_and_pid.remote() for w in workers]))
        self.placements.extend(ray.get([w.__ray_call__.remote(_placement) for w in workers]))

    def on_run_start(self, run) -> None:
        self._record()

    def after_round(self, run, record, clients) -> bool:
        self._record()
        return False


def two_node_run(run_dir: str) -> dict:
    """Start head + worker node, run 2 rounds of FedAvg with 2 workers, shut the cluster down."""
    import ray
    import torch
    from ray.cluster_utils import Cluster

    from rayfed import RunConfig
    from tests.conftest import tiny_overrides

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, num_gpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="WARNING")
        config = RunConfig().override(
            tiny_overrides(
                Path(run_dir),
                **{
                    "engine.backend": "ray",
                    "engine.num_gpus_per_worker": 0.5,  # 2 workers: min(2 CPUs / 1, 2 GPUs / 0.5)
                },
            )
        )
        recorder = NodeRecorder()
        simulation = recorder.simulation = Simulation(config, callbacks=[recorder])  # Ray is up: no session of its own
        result = simulation.run()
        cluster_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        return {
            "worker_nodes": sorted(recorder.nodes),
            "cluster_nodes": sorted(cluster_nodes),
            "rounds": result.rounds_run,
            "accuracy": result.final_accuracy,
            "placements": recorder.placements,
            "expected_device": "cuda" if torch.cuda.is_available() else "cpu",
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.timeout(240)
def test_workers_run_on_both_nodes_of_a_two_node_cluster(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, __file__, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=200,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("MULTINODE ")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-4000:]
    seen = json.loads(lines[-1][len("MULTINODE ") :])
    assert len(seen["cluster_nodes"]) == 2
    assert seen["worker_nodes"] == seen["cluster_nodes"]  # one ClientWorker on each node
    assert seen["rounds"] == 2 and 0.0 <= seen["accuracy"] <= 1.0
    # Fractional GPUs: every worker got a GPU id and trains on CUDA only where torch has one.
    assert seen["placements"] and all(len(gpus) == 1 for gpus, _ in seen["placements"])
    assert {device for _, device in seen["placements"]} == {seen["expected_device"]}


def test_pick_device_uses_cuda_only_when_given_a_gpu(monkeypatch) -> None:
    import torch

    from rayfed.execution.devices import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device(0.25) == torch.device("cpu")  # a GPU share, but no CUDA: train on the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU worker, here without CUDA:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # the device Ray gave the worker
    assert pick_device(0.25) == torch.device("cuda", 1)
    assert pick_device(0.0) == torch.device("cpu")


if __name__ == "__main__":
    print("MULTINODE " + json.dumps(two_node_run(sys.argv[1])), flush=True)
