"""The Ray executor: a ``ServerActor``, a pool of ``ClientWorker`` actors, data by reference."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import ray

from rayfed.actors.cluster import check_resources, default_num_workers
from rayfed.actors.server_actor import ServerActor
from rayfed.actors.worker_pool import WorkerPool
from rayfed.algorithms import RoundContext
from rayfed.client_runner import ClientReport, ClientState, EvalReport
from rayfed.config import RunConfig
from rayfed.data import ArrayDataset, Partition
from rayfed.executor import Chunk, Executor, states_of
from rayfed.problem import ProblemSpec

__all__ = ["RayExecutor"]


class RayExecutor(Executor):
    """Puts the dataset and the partition into the object store once; workers read them zero-copy."""

    def __init__(
        self,
        config: RunConfig,
        spec: ProblemSpec,
        dataset: ArrayDataset,
        partition: Partition,
        initial: Mapping[str, np.ndarray],
    ) -> None:
        engine = config.engine
        check_resources(engine)
        self.num_workers = default_num_workers(engine)
        self._dataset_ref = ray.put(dataset)
        self._partition_ref = ray.put(partition)
        self.server = ServerActor.remote(config, spec, dict(initial))  # type: ignore[attr-defined]
        options = {"num_cpus": engine.num_cpus_per_worker, "num_gpus": engine.num_gpus_per_worker, "max_restarts": 0}
        self.pool = WorkerPool(
            self.num_workers,
            options,
            (config, spec, self._dataset_ref, self._partition_ref),
            timeout_s=engine.round_timeout_s,
            max_retries=engine.max_retries,
        )

    def broadcast(self) -> Any:
        return self.server.broadcast.remote()

    def train(
        self, broadcast: Any, ctx: RoundContext, chunks: list[Chunk], states: Mapping[int, ClientState]
    ) -> tuple[list[Any], list[ClientReport], dict[int, ClientState]]:
        results = self.pool.map(
            "train", chunks, lambda i: (broadcast, ctx, chunks[i], states_of(states, chunks[i])), round_index=ctx.round
        )
        contributions, reports, new_states = [], [], {}
        for (contribution_ref,), (chunk_reports, chunk_states) in results:
            contributions.append(contribution_ref)
            reports.extend(chunk_reports)
            new_states.update(chunk_states)
        return contributions, reports, new_states

    def aggregate(self, ctx: RoundContext, contributions: list[Any]) -> dict[str, float]:
        return ray.get(self.server.aggregate.remote(ctx, *contributions))

    def evaluate(
        self, broadcast: Any, ctx: RoundContext, chunks: list[Chunk], states: Mapping[int, ClientState]
    ) -> list[EvalReport]:
        results = self.pool.map(
            "evaluate", chunks, lambda i: (broadcast, chunks[i], states_of(states, chunks[i])), round_index=ctx.round
        )
        return [report for _, chunk_reports in results for report in chunk_reports]

    def server_state(self) -> dict[str, np.ndarray]:
        return ray.get(self.server.state_dict.remote())

    def load_server_state(self, state: Mapping[str, np.ndarray]) -> None:
        ray.get(self.server.load_state_dict.remote(dict(state)))

    def close(self) -> None:
        self.pool.shutdown()
        try:
            ray.kill(self.server, no_restart=True)
        except Exception:
            pass
