"""``WorkerPool``: the driver-side pool of ``ClientWorker`` actors that runs a round's batches of clients.

It hands client batches to idle workers, keeps results in batch order, and follows the cluster
(after Ray's ``ActorPool`` and Ray Train's elastic ``WorkerGroup``):

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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, WorkerCrashedError

from rayfed.actors.client_worker import ClientWorker
from rayfed.execution.executor import no_progress
from rayfed.util.errors import WorkerError

logger = logging.getLogger(__name__)

__all__ = ["WorkerPool", "CallResult", "ACTOR_FAILURES", "kill_actor"]

ACTOR_FAILURES = (RayActorError, ActorDiedError, ActorUnavailableError, WorkerCrashedError)
"""What a call raises when its actor's process is gone (killed, out of memory, crashed) or unreachable."""
_EXIT_WAIT_S = 2.0
"""How long shutdown waits for the workers to exit on their own before killing them."""
_POLL_S = 1.0
"""The longest a wait for results lasts before timeouts and the cluster's size are looked at again."""


@dataclass(frozen=True)
class CallResult:
    """One chunk's call: the fetched last return value, the other return refs (unfetched), where it ran."""

    refs: list[Any]
    """The other return refs: ``train``'s contribution, which goes to the server by reference."""
    value: Any
    node: str
    """The Ray node that ran it, whose object store holds ``refs`` until someone fetches them."""


@dataclass(eq=False)
class _Worker:
    """One ``ClientWorker`` actor: its slot (the name in messages, kept by its replacement) and its start."""

    slot: int
    actor: Any
    ready: Any
    """``actor.node_and_pid`` ref: resolves once Ray has placed the actor and its constructor ran."""
    node: str = field(default="")
    """Its node's id, once started ("" before)."""


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
        self._pool: list[_Worker] = []
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

    def _spawn(self) -> None:
        if self._free_slots:  # a replacement takes the lowest slot a dropped worker left
            slot = min(self._free_slots)
            self._free_slots.remove(slot)
        else:
            slot = len(self._pool)
        actor = ClientWorker.options(**self._options).remote(*self._init_args)  # type: ignore[attr-defined]
        self._pool.append(_Worker(slot, actor, actor.node_and_pid.remote()))

    def _drop(self, worker: _Worker) -> None:
        kill_actor(worker.actor)
        self._pool.remove(worker)
        self._free_slots.append(worker.slot)

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
    ) -> list[CallResult]:
        """Run ``worker.method(*args(i))`` for every chunk i on idle workers, in round ``round_index``;
        return each chunk's :class:`CallResult`, in chunk order.

        Raises :class:`~rayfed.util.errors.WorkerError` when a chunk fails once more after
        ``max_retries`` re-runs, or when no worker could be placed for ``engine.resource_wait_s``.
        """
        self._resize()
        results: list[CallResult | None] = [None] * len(chunks)
        failures = [0] * len(chunks)
        queue = deque(range(len(chunks)))
        # Consecutive chunks go to the workers of one node, so that their sums can be folded there (folding.py).
        idle = deque(sorted((w for w in self._pool if w.node), key=lambda w: (w.node, w.slot)))
        inflight: dict[Any, tuple[int, _Worker, list[Any], float]] = {}
        stalled_since: float | None = None

        def failed(i: int, worker: _Worker, reason: str) -> None:
            failures[i] += 1
            if failures[i] > self._max_retries:
                raise WorkerError(
                    f"ClientWorker {worker.slot} failed ({reason}) in round {round_index} while running clients "
                    f"{_preview(chunks[i])}; these clients failed {failures[i]} times, and engine.max_retries="
                    f"{self._max_retries} allows {self._max_retries} re-runs."
                )
            logger.warning(
                "ClientWorker %d (node %s) failed (%s) while running clients %s; re-running them",
                worker.slot,
                worker.node[:8],
                reason,
                _preview(chunks[i]),
            )
            self._drop(worker)
            size = len(self._pool)
            self._resize()
            self.replacements += max(0, len(self._pool) - size)
            queue.appendleft(i)

        while queue or inflight:
            while queue and idle:
                worker, i = idle.popleft(), queue.popleft()
                refs = getattr(worker.actor, method).remote(*args(i))
                refs = list(refs) if isinstance(refs, (list, tuple)) else [refs]
                inflight[refs[-1]] = (i, worker, refs, time.monotonic())
            starting = {w.ready: w for w in self._pool if not w.node}
            if not inflight and not idle and not starting:
                stalled_since = self._wait_for_room(round_index, stalled_since)
                continue
            ready = _all_ready([*inflight, *starting], self._poll_s())
            for ref in ready:
                if ref in starting:
                    self._started(starting[ref], idle)
            answered = [ref for ref in ready if ref in inflight]
            for ref, value in zip(answered, _values(answered)):
                i, worker, refs, _ = inflight.pop(ref)
                if isinstance(value, ACTOR_FAILURES):
                    failed(i, worker, type(value).__name__)
                else:
                    results[i] = CallResult(refs[:-1], value, worker.node)
                    idle.append(worker)
                    on_chunk_done()
            for ref, (i, worker, _, started) in list(inflight.items()):
                if self._timeout_s is not None and time.monotonic() - started > self._timeout_s:
                    del inflight[ref]
                    failed(i, worker, f"no answer within engine.round_timeout_s={self._timeout_s:g}")
            if not ready:
                self._resize()
        return [r for r in results if r is not None]

    def fold(self, runs: Sequence[range], parts: Sequence[Any], nodes: Sequence[str], round_index: int) -> list[Any]:
        """Fold ``parts`` (refs, one per call) run by run, each on a worker of the node that holds it
        (:mod:`rayfed.actors.folding`); return what the server adds, left to right: the total of the runs folded,
        then the parts after them. Folding stops at the first run whose node has no started worker or whose fold
        fails or exceeds ``engine.round_timeout_s``: the server then fetches the rest itself, with the same sum."""
        first_on: dict[str, _Worker] = {}  # each node's started worker of the lowest slot
        for started in sorted(self._pool, key=lambda w: w.slot, reverse=True):
            if started.node:
                first_on[started.node] = started
        folds: list[tuple[Any, Any, int]] = []
        total: Any = None
        for run in runs:
            worker = first_on.get(nodes[run[0]])
            if worker is None:
                break
            total, ack = worker.actor.fold.remote(total, *parts[run.start : run.stop])
            folds.append((total, ack, run.stop))
        folded, done = None, 0
        for total, ack, stop in folds:
            try:
                ray.get(ack, timeout=self._timeout_s)
            except ray.exceptions.RayError as e:
                logger.warning(
                    "round %d: folding the sums of calls %d-%d failed (%s); the server fetches them itself",
                    round_index,
                    done,
                    len(parts) - 1,
                    type(e).__name__,
                )
                break
            folded, done = total, stop
        return [folded, *parts[done:]] if done else list(parts)

    def _started(self, worker: _Worker, idle: deque[_Worker]) -> None:
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
        time.sleep(min(_POLL_S, self._wait_s))
        return since

    def _poll_s(self) -> float:
        return _POLL_S if self._timeout_s is None else min(_POLL_S, self._timeout_s / 4)

    def shutdown(self) -> None:
        """Ask every worker to exit, wait up to a few seconds, then kill those still there."""
        exits = [w.actor.exit.remote() for w in self._pool if w.node]
        if exits:
            ray.wait(exits, num_returns=len(exits), timeout=_EXIT_WAIT_S)
        for worker in self._pool:
            kill_actor(worker.actor)
        self._pool = []


def _all_ready(refs: list[Any], timeout_s: float) -> list[Any]:
    """Wait up to ``timeout_s`` for one of ``refs``, then take every other one ready by then: calls that end
    together (a round's, on many workers) are collected in one pass, not one ``ray.wait`` over all refs each."""
    ready, rest = ray.wait(refs, num_returns=1, timeout=timeout_s)
    if ready and rest:
        ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
    return ready


def _values(refs: list[Any]) -> list[Any]:
    """The values of ready ``refs``, fetched together; where a worker failed, its error in place of its value."""
    try:
        return ray.get(refs)
    except ACTOR_FAILURES:
        return [_value_or_failure(ref) for ref in refs]


def _value_or_failure(ref: Any) -> Any:
    try:
        return ray.get(ref)
    except ACTOR_FAILURES as e:
        return e


def kill_actor(actor: Any) -> None:
    """End ``actor`` for good; nothing happens if it is already gone."""
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already gone
        pass


def _preview(chunk: Sequence[int], limit: int = 8) -> str:
    ids = list(chunk)
    text = ", ".join(map(str, ids[:limit]))
    return f"[{text}{', ...' if len(ids) > limit else ''}] ({len(ids)} clients)"
