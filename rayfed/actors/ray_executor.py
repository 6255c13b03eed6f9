"""The Ray executor: a ``ServerActor``, a pool of ``ClientWorker`` actors, data by reference.

Losing the server is handled like losing a worker (:mod:`rayfed.actors.worker_pool`).
Each server step (an aggregation, or loading a resumed state) is followed on the actor
by the next broadcast, which the driver waits for, and by a copy of the server's state,
which it does not wait for: the server makes it while the workers train, and the driver
keeps its reference, the start state of the coming round. When the ``ServerActor`` dies
(killed, out of memory, crashed), a fresh one is loaded with that state and the step is
re-run on the same partial sums, which are still in the object store; aggregation is
deterministic, so the round ends with the same result as an unfaulted one. A step is
re-run at most ``engine.max_retries`` times; its next failure, or a server that died
before its state was copied, stops the run with a :class:`~rayfed.util.errors.ServerError`,
and the run resumes from its last checkpoint.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import ray

from rayfed.actors.cluster import check_resources, default_num_workers
from rayfed.actors.server_actor import ServerActor
from rayfed.actors.worker_pool import ACTOR_FAILURES, WorkerPool, kill_actor
from rayfed.algorithms import RoundContext
from rayfed.config import RunConfig
from rayfed.data import ArrayDataset, ClientPartition
from rayfed.execution.executor import Chunk, Executor, no_progress, states_of
from rayfed.execution.reports import ClientReport, EvalReport
from rayfed.train.job import ClientState
from rayfed.train.problem import ProblemSpec
from rayfed.util.errors import ServerError

logger = logging.getLogger(__name__)

__all__ = ["RayExecutor"]

_CAUSE = "(often the server's memory)."


class RayExecutor(Executor):
    """Puts the dataset and the partition into the object store once; workers read them zero-copy."""

    def __init__(
        self,
        config: RunConfig,
        spec: ProblemSpec,
        dataset: ArrayDataset,
        partition: ClientPartition,
        initial: Mapping[str, np.ndarray],
    ) -> None:
        engine = config.engine
        check_resources(engine)
        self.num_workers = default_num_workers(engine)
        self._dataset_ref = ray.put(dataset)
        self._partition_ref = ray.put(partition)
        self._server_args = (config, spec, dict(initial))
        self._max_retries = engine.max_retries
        self._state: Any = None
        """Reference to the server's state after its last step: the start state of the coming round."""
        self._broadcast: Any = None
        self.server_restarts = 0
        self.server = self._spawn_server()
        options = {"num_cpus": engine.num_cpus_per_worker, "num_gpus": engine.num_gpus_per_worker, "max_restarts": 0}
        self.pool = WorkerPool(
            self.num_workers,
            options,
            (config, spec, self._dataset_ref, self._partition_ref),
            timeout_s=engine.round_timeout_s,
            max_retries=engine.max_retries,
        )
        self._on_server("while it was created", None)

    def _spawn_server(self) -> Any:
        return ServerActor.remote(*self._server_args)  # type: ignore[attr-defined]

    def _on_server(self, when: str, step: Callable[[Any], Any] | None) -> Any:
        """Run ``step(server)`` (an actor call, or nothing), make the next broadcast and a copy of the state.

        A dead server is replaced by a fresh one that holds the last state, and the step runs
        again, at most ``engine.max_retries`` times.
        """
        for failures in itertools.count():
            try:
                if failures:
                    self._restart_server(when)
                first = [] if step is None else [step(self.server)]
                broadcast = self.server.broadcast.remote()
                # The actor runs calls in order, so once it answers a later one, the broadcast is stored.
                *result, _ = ray.get([*first, self.server.pid.remote()])
                self._broadcast, self._state = broadcast, self.server.state_dict.remote()
                return result[0] if result else None
            except ACTOR_FAILURES as e:
                reason = type(e).__name__
                if failures >= self._max_retries:
                    raise ServerError(
                        f"the ServerActor died ({reason}) {when}, {failures + 1} times; engine.max_retries="
                        f"{self._max_retries} allows {self._max_retries} restarts {_CAUSE}"
                    ) from e
                logger.warning("ServerActor died (%s) %s; replacing it by one holding the last state", reason, when)

    def _last_state(self, when: str) -> dict[str, np.ndarray] | None:
        """The server's state after its last step (None before the first one)."""
        try:
            return None if self._state is None else ray.get(self._state)
        except ACTOR_FAILURES as e:
            raise ServerError(
                f"the ServerActor died ({type(e).__name__}) {when}, before it had copied its state {_CAUSE}"
            ) from e

    def _restart_server(self, when: str) -> None:
        state = self._last_state(when)
        kill_actor(self.server)
        self.server = self._spawn_server()
        self.server_restarts += 1
        if state is not None:
            ray.get(self.server.load_state_dict.remote(state))

    def broadcast(self) -> Any:
        return self._broadcast

    def train(
        self,
        broadcast: Any,
        ctx: RoundContext,
        chunks: list[Chunk],
        states: Mapping[int, ClientState],
        on_chunk_done: Callable[[], object] = no_progress,
    ) -> tuple[list[Any], list[ClientReport], dict[int, ClientState]]:
        results = self.pool.map(
            "train",
            chunks,
            lambda i: (broadcast, ctx, chunks[i], states_of(states, chunks[i])),
            round_index=ctx.round,
            on_chunk_done=on_chunk_done,
        )
        contributions, reports, new_states = [], [], {}
        for (contribution_ref,), (chunk_reports, chunk_states) in results:
            contributions.append(contribution_ref)
            reports.extend(chunk_reports)
            new_states.update(chunk_states)
        return contributions, reports, new_states

    def aggregate(self, ctx: RoundContext, contributions: list[Any]) -> dict[str, float]:
        return self._on_server(f"in round {ctx.round}", lambda server: server.aggregate.remote(ctx, *contributions))

    def evaluate(
        self,
        broadcast: Any,
        ctx: RoundContext,
        chunks: list[Chunk],
        states: Mapping[int, ClientState],
        on_chunk_done: Callable[[], object] = no_progress,
    ) -> list[EvalReport]:
        results = self.pool.map(
            "evaluate",
            chunks,
            lambda i: (broadcast, ctx, chunks[i], states_of(states, chunks[i])),
            round_index=ctx.round,
            on_chunk_done=on_chunk_done,
        )
        return [report for _, chunk_reports in results for report in chunk_reports]

    def server_state(self) -> dict[str, np.ndarray]:
        state = self._last_state("after its last step")
        assert state is not None  # copied when the executor was made
        return state

    def load_server_state(self, state: Mapping[str, np.ndarray]) -> None:
        self._on_server("while the resumed state was loaded", lambda server: server.load_state_dict.remote(dict(state)))

    def close(self) -> None:
        self.pool.shutdown()
        kill_actor(self.server)
