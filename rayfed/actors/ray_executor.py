"""The Ray executor: a ``ServerActor``, a pool of ``ClientWorker`` actors, data by reference.

Losing a worker, or a node with workers on it, is handled by :mod:`rayfed.actors.worker_pool`; a
node that left after its workers finished their calls takes their contributions with it, as
they live in its object store until the server fetches them: those clients are trained again on
the remaining workers from the round's same inputs before the server aggregates, so nothing is
lost or counted twice. Losing the server is handled like losing a worker. The calls' sums are added along a
tree over the calls' indices (:mod:`rayfed.execution.summation`): each worker node adds up the subtrees of the
calls it ran and sends the server one object (:meth:`~rayfed.actors.worker_pool.WorkerPool.reduce_on_nodes`), with
the numbers of ``engine.backend=local`` to the last bit.
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
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayfed.actors.cluster import alive_node_ids, ask_for_workers, check_resources, pool_target
from rayfed.actors.pool_calls import CallResult
from rayfed.actors.ray_calls import ACTOR_FAILURES, kill_actor
from rayfed.actors.server_actor import ServerActor
from rayfed.actors.worker_pool import WorkerPool
from rayfed.config import RunConfig
from rayfed.data import ArrayDataset, ClientPartition
from rayfed.execution.executor import Executor, RoundCalls, no_progress
from rayfed.execution.reports import ClientReport, EvalReport
from rayfed.execution.round_facts import RoundFacts
from rayfed.train.job import ClientState
from rayfed.train.problem import ProblemSpec
from rayfed.util.errors import ServerError, WorkerError
from rayfed.util.plugins import WithCode

logger = logging.getLogger(__name__)

__all__ = ["RayExecutor"]

_CAUSE = "(often the server's memory)."
_NODE_DEATH_WAIT_S = 60.0
"""How long a failed aggregation waits for Ray to mark the node that held a lost contribution dead."""


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
        self._dataset_ref = ray.put(dataset)
        self.dataset = ray.get(self._dataset_ref)
        self._partition_ref = ray.put(partition)
        config_ref = ray.put(WithCode(config))  # pickled once with its code beside it (rayfed.util.plugins)
        self._server_args = (config_ref, spec, dict(initial))
        self._max_retries = engine.max_retries
        self._server_node: str = ray.get_runtime_context().get_node_id()
        """The driver's node, where the ``ServerActor`` is placed (strictly)."""
        self._state: Any = None
        """Reference to the server's state after its last step: the start state of the coming round."""
        self._broadcast: Any = None
        self.server_restarts = 0
        self.contributions_rerun = 0
        """Batches of clients trained again because the node holding their contribution left."""
        self._round_inputs: tuple[RoundCalls, Any] | None = None
        """The round's calls and the object-store copy of its facts, which the calls carry."""
        self._ran_on: list[str] = []
        """The node each chunk of the round trained on, whose object store holds its contribution."""
        self.server = self._spawn_server()
        options = {"num_cpus": engine.num_cpus_per_worker, "num_gpus": engine.num_gpus_per_worker, "max_restarts": 0}
        self.pool = WorkerPool(
            lambda: pool_target(engine),
            options,
            (config_ref, spec, self._dataset_ref, self._partition_ref),
            timeout_s=engine.round_timeout_s,
            max_retries=engine.max_retries,
            wait_s=engine.resource_wait_s,
            ask_for_workers=lambda: ask_for_workers(engine),
        )
        self._on_server("while it was created", None)

    def _spawn_server(self) -> Any:
        """The ``ServerActor``, on the driver's node, so that a worker node that leaves never takes the server or its
        state with it: the head's loss is the run's. The affinity is strict: the actor asks for no resource, so the
        driver's node can always take it, and Ray's soft affinity placed it on a worker node when the head had no
        CPU (measured with ``ray.cluster_utils.Cluster``)."""
        here = NodeAffinitySchedulingStrategy(self._server_node, soft=False)
        return ServerActor.options(scheduling_strategy=here).remote(*self._server_args)  # type: ignore[attr-defined]

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

    def message(self, broadcast: Any) -> Any:
        return ray.get(broadcast)

    def train(
        self, calls: RoundCalls, on_chunk_done: Callable[[], object] = no_progress
    ) -> tuple[list[Any], list[ClientReport], dict[int, ClientState]]:
        self._round_inputs = (calls, ray.put(calls.facts))
        results = self._train_chunks(list(range(len(calls.chunks))), on_chunk_done)
        self._ran_on = [result.node for result in results]
        contributions, reports, new_states = [], [], {}
        for result in results:
            chunk_reports, chunk_states = result.value
            contributions.append(_sum_of(result))
            reports.extend(chunk_reports)
            new_states.update(chunk_states)
        return contributions, reports, new_states

    def _train_chunks(self, indices: list[int], on_chunk_done: Callable[[], object] = no_progress) -> list[CallResult]:
        """Train the round's chunks ``indices`` (:meth:`train`'s inputs) on the pool."""
        assert self._round_inputs is not None
        calls, facts = self._round_inputs  # the round's facts travel once, not once a call
        return self.pool.map(
            "train",
            [calls.chunks[i] for i in indices],
            lambda k: calls.arguments(indices[k], facts),
            round_index=calls.facts.round,
            on_chunk_done=on_chunk_done,
            summed=(len(calls.chunks), indices),
        )

    def aggregate(self, ctx: RoundFacts, contributions: list[Any]) -> dict[str, float]:
        contributions = list(contributions)
        for attempt in itertools.count():
            self._retrain_lost(contributions, wait_s=_NODE_DEATH_WAIT_S if attempt else 0.0)
            calls = len(contributions)
            spans, parts, nodes = _to_server(contributions, self._ran_on)
            spans, parts = self.pool.merge_on_nodes(calls, spans, parts, nodes, ctx.round)
            try:
                return self._on_server(
                    f"in round {ctx.round}", lambda server: server.aggregate.remote(ctx, calls, spans, *parts)
                )
            except ray.exceptions.ObjectLostError as e:
                if attempt >= self._max_retries:
                    raise WorkerError(
                        f"round {ctx.round}: contributions were lost {attempt + 1} times before the server could "
                        f"fetch them ({type(e).__name__}); engine.max_retries={self._max_retries} allows "
                        f"{self._max_retries} re-runs."
                    ) from e
                logger.warning("round %d: a contribution was lost (%s); re-running its clients", ctx.round, e)
        raise AssertionError("unreachable")

    def _retrain_lost(self, contributions: list[Any], *, wait_s: float) -> None:
        """Train again, in place, the chunks whose node has left since they trained there (waiting up to
        ``wait_s`` for Ray to mark such a node dead, after an aggregation that lost an object)."""
        deadline = time.monotonic() + wait_s
        while not (lost := self._on_nodes_gone()) and time.monotonic() < deadline:
            time.sleep(1.0)
        if not lost:
            return
        logger.warning("the node holding the contributions of %d batch(es) left; training them again", len(lost))
        for i, result in zip(lost, self._train_chunks(lost)):
            contributions[i] = _sum_of(result)
            self._ran_on[i] = result.node
        self.contributions_rerun += len(lost)

    @property
    def server_node(self) -> str:
        """The node the ``ServerActor`` runs on: the driver's."""
        return self._server_node

    @property
    def calls_ran_on(self) -> list[str]:
        """The node each train call of the round ran on (whose object store holds its contribution)."""
        return list(self._ran_on)

    def _on_nodes_gone(self) -> list[int]:
        """The round's chunks that trained on a node which is no longer alive. Chunks that trained on the server's
        node need no asking: while the server runs, so does its node."""
        elsewhere = {node for node in self._ran_on if node != self._server_node}
        alive = alive_node_ids() if elsewhere else set()
        return [i for i, node in enumerate(self._ran_on) if node in elsewhere and node not in alive]

    def evaluate(self, calls: RoundCalls, on_chunk_done: Callable[[], object] = no_progress) -> list[EvalReport]:
        facts = ray.put(calls.facts)
        results = self.pool.map(
            "evaluate",
            calls.chunks,
            lambda i: calls.arguments(i, facts),
            round_index=calls.facts.round,
            on_chunk_done=on_chunk_done,
        )
        return [report for result in results for report in result.value]

    def server_state(self) -> dict[str, np.ndarray]:
        state = self._last_state("after its last step")
        assert state is not None  # copied when the executor was made
        return state

    def load_server_state(self, state: Mapping[str, np.ndarray]) -> None:
        self._on_server("while the resumed state was loaded", lambda server: server.load_state_dict.remote(dict(state)))

    def close(self) -> None:
        self._round_inputs = None
        self.pool.shutdown()
        kill_actor(self.server)


def _sum_of(result: CallResult) -> tuple[Any, bool]:
    """A train call's handle on its sum: the ref of its own sum, or of its node's sums (True), which span it."""
    (ref,) = result.refs
    return ref, result.summed_on_node


def _to_server(
    contributions: Sequence[tuple[Any, bool]], nodes: Sequence[str]
) -> tuple[list[range | None], list[Any], list[str]]:
    """The objects that hold the round's calls' sums (:func:`_sum_of`), with their spans and nodes: each node's
    sums once (its span None: the sums name theirs), and every other call's own sum, with its span."""
    spans: list[range | None] = []
    objects: list[Any] = []
    where: list[str] = []
    seen: set[Any] = set()
    for i, ((ref, of_node), node) in enumerate(zip(contributions, nodes, strict=True)):
        if of_node and ref in seen:
            continue
        seen.add(ref)
        spans.append(None if of_node else range(i, i + 1))
        objects.append(ref)
        where.append(node)
    return spans, objects, where
