"""``WorkerPool``: the driver-side pool of ``ClientWorker`` actors that runs a round's batches of clients.

It hands client batches to idle workers, keeps results in batch order, and handles
failures on purpose (after Ray's ``ActorPool`` and Ray Train's ``WorkerGroup``): a
worker that dies, or a call that exceeds ``engine.round_timeout_s``, is replaced by a
fresh actor and its batch is re-run, so the round completes with the same result as an
unfaulted one. A batch is re-run at most ``engine.max_retries`` times; its next failure
stops the run with a :class:`~rayfed.util.errors.WorkerError` (a batch that kills every
worker it meets is a bug or a resource problem, not bad luck), and the run directory
keeps its last checkpoint, from which the run resumes.

At shutdown every worker is first asked to exit (``ray.actor.exit_actor``), so it ends
its process cleanly, and only then killed if it has not.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, WorkerCrashedError

from rayfed.actors.client_worker import ClientWorker
from rayfed.execution.executor import no_progress
from rayfed.util.errors import WorkerError

logger = logging.getLogger(__name__)

__all__ = ["WorkerPool", "ACTOR_FAILURES", "kill_actor"]

ACTOR_FAILURES = (RayActorError, ActorDiedError, ActorUnavailableError, WorkerCrashedError)
"""What a call raises when its actor's process is gone (killed, out of memory, crashed) or unreachable."""
_EXIT_WAIT_S = 2.0
"""How long shutdown waits for the workers to exit on their own before killing them."""


class WorkerPool:
    """A fixed number of ``ClientWorker`` actors, replaced when they fail."""

    def __init__(
        self,
        num_workers: int,
        options: dict[str, Any],
        init_args: Sequence[Any],
        *,
        timeout_s: float | None,
        max_retries: int,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, but got num_workers={num_workers}")
        self._options = options
        self._init_args = tuple(init_args)
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self.workers = [self._spawn() for _ in range(num_workers)]
        self.replacements = 0

    def _spawn(self) -> Any:
        return ClientWorker.options(**self._options).remote(*self._init_args)  # type: ignore[attr-defined]

    def _replace(self, index: int, reason: str, chunk: Sequence[int]) -> None:
        logger.warning(
            "ClientWorker %d failed (%s) while running clients %s; replacing it and re-running them",
            index,
            reason,
            _preview(chunk),
        )
        kill_actor(self.workers[index])
        self.workers[index] = self._spawn()
        self.replacements += 1

    def map(
        self,
        method: str,
        chunks: Sequence[Sequence[int]],
        args: Callable[[int], tuple[Any, ...]],
        *,
        round_index: int,
        on_chunk_done: Callable[[], object] = no_progress,
    ) -> list[tuple[list[Any], Any]]:
        """Run ``worker.method(*args(i))`` for every chunk i on idle workers, in round ``round_index``.

        Returns, in chunk order, ``(extra_refs, value)``: ``value`` is the fetched last
        return value and ``extra_refs`` the unfetched other return refs (the
        contribution of ``train``, which goes to the server by reference).

        Raises :class:`~rayfed.util.errors.WorkerError` when a chunk fails once more after
        ``max_retries`` re-runs.
        """
        results: list[tuple[list[Any], Any] | None] = [None] * len(chunks)
        failures = [0] * len(chunks)
        queue = deque(range(len(chunks)))
        idle = deque(range(len(self.workers)))
        inflight: dict[Any, tuple[int, int, list[Any], float]] = {}

        def failed(i: int, w: int, reason: str) -> None:
            failures[i] += 1
            if failures[i] > self._max_retries:
                raise WorkerError(
                    f"ClientWorker {w} failed ({reason}) in round {round_index} while running clients "
                    f"{_preview(chunks[i])}; these clients failed {failures[i]} times, and engine.max_retries="
                    f"{self._max_retries} allows {self._max_retries} re-runs."
                )
            self._replace(w, reason, chunks[i])
            queue.appendleft(i)
            idle.append(w)

        while queue or inflight:
            while queue and idle:
                w, i = idle.popleft(), queue.popleft()
                refs = getattr(self.workers[w], method).remote(*args(i))
                refs = list(refs) if isinstance(refs, (list, tuple)) else [refs]
                inflight[refs[-1]] = (i, w, refs, time.monotonic())
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=self._poll_s())
            for ref in ready:
                i, w, refs, _ = inflight.pop(ref)
                try:
                    value = ray.get(ref)
                except ACTOR_FAILURES as e:
                    failed(i, w, type(e).__name__)
                else:
                    results[i] = (refs[:-1], value)
                    idle.append(w)
                    on_chunk_done()
            for ref, (i, w, _, started) in list(inflight.items()):
                if self._timeout_s is not None and time.monotonic() - started > self._timeout_s:
                    del inflight[ref]
                    failed(i, w, f"no answer within engine.round_timeout_s={self._timeout_s:g}")
        return [r for r in results if r is not None]

    def _poll_s(self) -> float | None:
        return None if self._timeout_s is None else min(1.0, self._timeout_s / 4)

    def shutdown(self) -> None:
        """Ask every worker to exit, wait up to a few seconds, then kill those still there."""
        exits = [worker.exit.remote() for worker in self.workers]
        if exits:
            ray.wait(exits, num_returns=len(exits), timeout=_EXIT_WAIT_S)
        for worker in self.workers:
            kill_actor(worker)
        self.workers = []


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
