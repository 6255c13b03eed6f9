"""``WorkerPool``: the driver-side pool of ``ClientWorker`` actors that runs a round's batches of clients.

It hands client batches to idle workers, keeps results in batch order, and follows the cluster
(after Ray's ``ActorPool`` and Ray Train's elastic ``WorkerGroup``):

* **Nodes.** Each node gets a stretch of consecutive calls, as long as its share of the workers
  (:mod:`rayfed.actors.call_queues`). The driver's own node's workers hold up to
  :data:`~rayfed.actors.pool_calls.DEPTH` calls each: the one they run and the next, which Ray queues on the actor,
  so that a worker starts its next call as soon as it ends one rather than once the driver has heard of it and
  answered; every other node gets its whole stretch in one call to its :class:`~rayfed.actors.node_agent.NodeAgent`,
  which runs it on the node's workers and adds up their sums there. The driver so makes a call and reads a reply
  per node, not per worker, and the server fetches one object per node.

* **Size.** Before each batch of calls, and after each failure, the pool is brought to ``target()``
  workers, the number the cluster's alive nodes hold now (``engine.num_workers``, or all of them up
  to ``engine.max_workers``): a node that joins gets workers from the next call on. A new worker
  takes batches once Ray has placed it and it has started; until then the others run them.
* **Failure.** A worker that dies (its process or its node), or a call that exceeds
  ``engine.round_timeout_s``, is dropped and its batch is re-run on another worker in the same
  round; a replacement is started only where the cluster still has room for it, so a pool on a
  node that left shrinks instead of waiting for it. Batches never depend on the pool, so a round
  ends with the same result as an unfaulted one on a fixed pool. A batch is re-run at most
  ``engine.max_retries`` times; its next failure stops the run with a
  :class:`~rayfed.util.errors.WorkerError` (a batch that kills every worker it meets is a bug or a
  resource problem, not bad luck).
* **No worker left.** When the cluster holds no worker at all, the pool asks the autoscaler for one,
  says what it waits for, and waits up to ``engine.resource_wait_s``; then the run stops with a
  :class:`~rayfed.util.errors.WorkerError`, and the run directory keeps its last checkpoint.

At shutdown every worker is first asked to exit (``ray.actor.exit_actor``), so it ends
its process cleanly, and only then killed if it has not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from rayfed.actors.call_queues import CallQueues
from rayfed.actors.client_worker import ClientWorker
from rayfed.actors.cluster import alive_node_ids
from rayfed.actors.node_agent import NOT_RUN, NodeAgents, Outcome
from rayfed.actors.pool_calls import DEPTH, Batch, CallResult, PoolWorker, place, preview
from rayfed.actors.ray_calls import ACTOR_FAILURES, POLL_S, Flight, InFlight, kill_actor, timeout_text
from rayfed.execution.executor import no_progress
from rayfed.util.errors import WorkerError

logger = logging.getLogger(__name__)

__all__ = ["WorkerPool"]

_EXIT_WAIT_S = 2.0
"""How long shutdown waits for the workers to exit on their own before killing them."""


class WorkerPool:
    """``ClientWorker`` actors, as many as ``target()`` says the cluster holds, replaced when they fail."""

    def __init__(
        self,
        target: Callable[[], int],
        options: dict[str, Any],
        init_args: Sequence[Any],
        *,
        timeout_s: float | None,
        max_retries: int,
        wait_s: float,
        ask_for_workers: Callable[[], str],
    ) -> None:
        self._target = target
        self._options = options
        self._init_args = tuple(init_args)
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._wait_s = wait_s
        self._ask_for_workers = ask_for_workers
        self._here: str = ray.get_runtime_context().get_node_id()
        """The driver's node: its workers are called directly, those of every other node through its agent."""
        self._agents = NodeAgents(self._init_args[0] if self._init_args else None)  # the run's config comes first
        self._pool: list[PoolWorker] = []
        self._free_slots: list[int] = []
        self.replacements = 0
        """Workers started in place of failed ones."""
        self._resize()

    @property
    def size(self) -> int:
        """Workers in the pool, those Ray is still placing or starting included."""
        return len(self._pool)

    @property
    def workers(self) -> list[Any]:
        """The actors that have started, in slot order."""
        return [w.actor for w in sorted(self._pool, key=lambda w: w.slot) if w.node]

    @property
    def agents(self) -> dict[str, Any]:
        """The node agents started so far, by node (the driver's own node has none)."""
        return self._agents.started()

    def merge_on_nodes(
        self, calls: int, spans: list[range | None], received: list[Any], nodes: list[str], round_index: int
    ) -> tuple[list[range | None], list[Any]]:
        """One object per worker node for the server: see :meth:`NodeAgents.merge`."""
        return self._agents.merge(calls, spans, received, nodes, self._timeout_s, round_index)

    def _spawn(self) -> None:
        if self._free_slots:  # a replacement takes the lowest slot a dropped worker left
            slot = min(self._free_slots)
            self._free_slots.remove(slot)
        else:
            slot = len(self._pool)
        actor = ClientWorker.options(**self._options).remote(*self._init_args)  # type: ignore[attr-defined]
        self._pool.append(PoolWorker(slot, actor, actor.node_and_pid.remote()))

    def _drop(self, worker: PoolWorker) -> None:
        kill_actor(worker.actor)
        self._pool.remove(worker)
        self._free_slots.append(worker.slot)
        if worker.node and not any(w.node == worker.node for w in self._pool):
            self._agents.forget(worker.node)

    def _resize(self) -> None:
        """Start workers up to the cluster's room; past it, stop those Ray has not placed yet."""
        wanted = self._target()
        before = len(self._pool)
        while len(self._pool) < wanted:
            self._spawn()
        for worker in [w for w in self._pool if not w.node][: max(0, len(self._pool) - wanted)]:
            self._drop(worker)
        if before and len(self._pool) != before:
            logger.info("the cluster's room changed: %d ClientWorkers (was %d)", len(self._pool), before)

    def map(
        self,
        method: str,
        chunks: Sequence[Sequence[int]],
        args: Callable[[int], tuple[Any, ...]],
        *,
        round_index: int,
        on_chunk_done: Callable[[], object] = no_progress,
        summed: tuple[int, Sequence[int]] | None = None,
    ) -> list[CallResult]:
        """Run ``worker.method(*args(i))`` for every chunk i on idle workers, in round ``round_index``;
        return each chunk's :class:`CallResult`, in chunk order. With ``summed`` (the round's number of calls and
        each chunk's place among them), the calls' first return values are sums that each node's agent adds up
        along the round's summation tree.

        Raises :class:`~rayfed.util.errors.WorkerError` when a chunk fails once more after
        ``max_retries`` re-runs, or when no worker could be placed for ``engine.resource_wait_s``.
        """
        self._resize()
        results: list[CallResult | None] = [None] * len(chunks)
        failures = [0] * len(chunks)
        for worker in self._pool:
            worker.running.clear()
        idle = sorted((w for w in self._pool if w.node), key=lambda w: (w.node, w.slot))
        queue = CallQueues(len(chunks), (w.node for w in idle))
        flights: InFlight[Batch] = InFlight()
        stalled_since: float | None = None

        def failed(i: int, node: str, reason: str, worker: PoolWorker | None) -> None:
            """Chunk i failed on ``worker`` (dropped), or with its node's agent (None): it runs again."""
            failures[i] += 1
            who = f"ClientWorker {worker.slot}" if worker else f"the agent of node {node[:8]}"
            if failures[i] > self._max_retries:
                raise WorkerError(
                    f"{who} failed ({reason}) in round {round_index} while running clients {preview(chunks[i])}; "
                    f"these clients failed {failures[i]} times, and engine.max_retries={self._max_retries} allows "
                    f"{self._max_retries} re-runs."
                )
            logger.warning(
                "%s (node %s) failed (%s) while running clients %s; re-running them",
                who,
                node[:8],
                reason,
                preview(chunks[i]),
            )
            if worker is not None:
                self._drop(worker)
                size = len(self._pool)
                self._resize()
                self.replacements += max(0, len(self._pool) - size)
            queue.put_back(i, node)

        def done(i: int, node: str, value: Any, refs: list[Any], by_agent: bool) -> None:
            """Chunk i ran; ``refs``: its other return refs, or, run by its node's agent, the node's sums."""
            of_node = by_agent and summed is not None
            results[i] = CallResult(refs if of_node or not by_agent else [], value, node, of_node)
            on_chunk_done()

        while len(queue) or len(flights):
            self._dispatch(method, queue, idle, flights, args, summed)
            starting = {w.ready: w for w in self._pool if not w.node}
            if not len(flights) and not idle and not starting:
                stalled_since = self._wait_for_room(round_index, stalled_since)
                continue
            answered, started = flights.answered(starting, self._poll_s())
            for ref in started:
                self._started(starting[ref], idle)
            for flight, value in sorted(answered, key=lambda answer: place(answer[0].about)):
                batch = flight.about
                if isinstance(value, ACTOR_FAILURES):
                    self._lost(batch, type(value).__name__, failed, idle, queue)
                elif batch.by_agent:
                    self._from_agent(batch, flight, value, queue, failed, done, idle)
                else:
                    self._ran(batch, flight, value, done, idle)
            for flight in flights.overdue():
                self._lost(flight.about, timeout_text(self._timeout_s), failed, idle, queue)
            if not answered and not started:
                self._resize()
        return [r for r in results if r is not None]

    def _dispatch(
        self,
        method: str,
        queue: CallQueues,
        idle: list[PoolWorker],
        flights: InFlight[Batch],
        args: Callable[[int], tuple[Any, ...]],
        summed: tuple[int, Sequence[int]] | None,
    ) -> None:
        """Give waiting calls to idle workers: every other node's stretch in one call to its agent (when it has
        none in flight), then to the driver's node's workers, the least busy first, up to
        :data:`~rayfed.actors.pool_calls.DEPTH` calls each."""
        busy = {flight.about.node for flight in flights if flight.about.by_agent}
        elsewhere: dict[str, list[PoolWorker]] = {}
        for worker in idle:
            if worker.node != self._here and worker.node not in busy:
                elsewhere.setdefault(worker.node, []).append(worker)
        for node, workers in elsewhere.items():
            calls = queue.take_stretch(node, len(workers))
            if not calls:
                continue
            for worker in workers:
                idle.remove(worker)
            tree = None if summed is None else (summed[0], {i: summed[1][i] for i in calls})
            refs = self._agents.on(node).run.remote(
                method, [(i, args(i)) for i in calls], [(w.slot, w.actor) for w in workers], self._timeout_s, tree
            )
            rounds_of_calls = -(-len(calls) // len(workers))  # the agent's calls, one after another per worker
            limit = None if self._timeout_s is None else self._timeout_s * (rounds_of_calls + 1)
            flights.add(Batch(calls, workers, node, by_agent=True), refs, limit)
        here = [w for w in idle if w.node == self._here]
        workers_here = sum(w.node == self._here for w in self._pool)
        while here:
            worker = min(here, key=lambda w: len(w.running))  # every worker's next call before any one's second
            if worker.running and len(queue) < workers_here:  # the last calls: one at a time, to whoever is free
                break
            i = queue.take(worker.node)
            if i is None:
                break
            limit = None if self._timeout_s is None else self._timeout_s * (len(worker.running) + 1)
            worker.running.append(i)
            flights.add(Batch([i], [worker], worker.node, False), getattr(worker.actor, method).remote(*args(i)), limit)
            if len(worker.running) >= DEPTH:
                here.remove(worker)
                idle.remove(worker)

    def _ran(
        self,
        batch: Batch,
        flight: Flight[Batch],
        value: Any,
        done: Callable[[int, str, Any, list[Any], bool], None],
        idle: list[PoolWorker],
    ) -> None:
        """A worker of the driver's node answered a call (unless it failed before: the call went back then)."""
        worker, call = batch.workers[0], batch.calls[0]
        if call not in worker.running:
            return
        worker.running.remove(call)
        done(call, batch.node, value, flight.refs[:-1], False)
        if worker not in idle:
            idle.append(worker)

    def _from_agent(
        self,
        batch: Batch,
        flight: Flight[Batch],
        outcomes: list[Outcome],
        queue: CallQueues,
        failed: Callable[[int, str, str, PoolWorker | None], None],
        done: Callable[[int, str, Any, list[Any], bool], None],
        idle: list[PoolWorker],
    ) -> None:
        """A node's agent answered: its calls' replies, and its node's sums (``flight.refs[0]``)."""
        workers = {w.slot: w for w in batch.workers}
        for outcome in outcomes:
            if outcome.failure == NOT_RUN:
                queue.put_back(outcome.call, batch.node)
            elif outcome.failure:
                failed(outcome.call, batch.node, outcome.failure, workers.pop(outcome.slot))
            else:
                done(outcome.call, batch.node, outcome.value, flight.refs[:1], True)
        idle.extend(workers.values())

    def _lost(
        self,
        batch: Batch,
        reason: str,
        failed: Callable[[int, str, str, PoolWorker | None], None],
        idle: list[PoolWorker],
        queue: CallQueues,
    ) -> None:
        """A call died with its worker, or a node's agent with its calls (its node left, or the agent alone died or
        hung: it is replaced, and the node's workers stay in the pool while the node is alive). A worker's failure is
        its running call's; the calls queued behind it go back to the queue as they were."""
        if not batch.by_agent:
            worker = batch.workers[0]
            if batch.calls[0] not in worker.running:  # its worker failed already: the call went back then
                return
            running, *behind = worker.running
            worker.running.clear()
            for i in reversed(behind):
                queue.put_back(i, worker.node)
            if worker in idle:
                idle.remove(worker)
            failed(running, batch.node, reason, worker)
            return
        self._agents.forget(batch.node)
        alive = batch.node in alive_node_ids()
        for worker in batch.workers:
            if alive:
                idle.append(worker)
            else:
                self._drop(worker)
        for i in batch.calls:
            failed(i, batch.node, reason, None)
        if not alive:
            self._resize()

    def _started(self, worker: PoolWorker, idle: list[PoolWorker]) -> None:
        """A new worker has been placed (or its creation failed: it is dropped, and its node's room re-read)."""
        try:
            worker.node, _ = ray.get(worker.ready)
        except ACTOR_FAILURES as e:
            if getattr(e, "actor_init_failed", False):
                raise WorkerError(f"a ClientWorker failed to start: {e}") from e
            self._drop(worker)
            self._resize()
        else:
            idle.append(worker)

    def _wait_for_room(self, round_index: int, since: float | None) -> float | None:
        """No worker is left: start those the cluster has room for, else wait up to ``engine.resource_wait_s`` for
        room. Returns when the wait began (None once workers are starting again)."""
        self._resize()
        if self._pool:
            return None
        now = time.monotonic()
        if since is None:
            logger.warning(
                "round %d: no ClientWorker is left and the Ray cluster has room for none; %s, waiting up to "
                "engine.resource_wait_s=%g s",
                round_index,
                self._ask_for_workers(),
                self._wait_s,
            )
            since = now
        if now - since >= self._wait_s:
            raise WorkerError(
                f"round {round_index}: no ClientWorker is left and the Ray cluster had room for none for "
                f"engine.resource_wait_s={self._wait_s:g} s; raise it to wait longer for nodes to join."
            )
        time.sleep(min(POLL_S, self._wait_s))
        return since

    def _poll_s(self) -> float:
        return POLL_S if self._timeout_s is None else min(POLL_S, self._timeout_s / 4)

    def shutdown(self) -> None:
        """Ask every worker to exit, wait up to a few seconds, then kill those still there."""
        exits = [w.actor.exit.remote() for w in self._pool if w.node]
        if exits:
            ray.wait(exits, num_returns=len(exits), timeout=_EXIT_WAIT_S)
        for worker in self._pool:
            kill_actor(worker.actor)
        self._pool = []
        self._agents.shutdown()
