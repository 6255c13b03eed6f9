"""``ClientWorker`` actors and the driver-side pool that feeds them batches of clients.

The actor is a thin shell over :class:`rayfed.worker.ClientRunner`. The pool
(:class:`WorkerPool`) hands out client batches to idle workers, keeps results in batch
order, and handles failures on purpose (after Ray's ``ActorPool`` and Train's
``WorkerGroup``): a worker that dies, or a call that exceeds
``engine.round_timeout_s``, is replaced by a fresh actor and its batch is re-run, so the
round completes with the same result as an unfaulted one.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, WorkerCrashedError

from rayfed.worker import ClientRunner, EvalReport

logger = logging.getLogger(__name__)

__all__ = ["ClientWorker", "WorkerPool"]

_WORKER_FAILURES = (RayActorError, ActorDiedError, ActorUnavailableError, WorkerCrashedError)


def keep_freed_memory() -> bool:
    """Let glibc keep freed buffers of up to 32 MiB in this process's heap (Linux only).

    A worker allocates and frees the same MB-sized buffers thousands of times per round
    (activations, gradients, each client's contribution). By default glibc maps many of them
    fresh and unmaps them on free, so their pages fault in again each time: 500-800 page
    faults per client of the 4-layer CNN. With these limits there were none, and
    ClientWorker busy time went from 93 % to 96 % of the call time on the 2-core box. A
    worker owns its process, so it changes only its own allocator. Returns False where
    ``mallopt`` is unavailable, and then does nothing.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 256 << 20))


@ray.remote
class ClientWorker:
    """Ray actor running a :class:`~rayfed.worker.ClientRunner`."""

    def __init__(self, *args: Any) -> None:
        keep_freed_memory()
        self.runner = ClientRunner(*args)

    @ray.method(num_returns=2)
    def train(self, broadcast: Any, ctx: Any, client_ids: list[int], states: dict) -> tuple[Any, Any]:
        """Returns (summed contribution, (reports, new states)) as two objects: the first goes to the server."""
        result = self.runner.train(broadcast, ctx, client_ids, states)
        return result.contribution, (result.reports, result.states)

    def evaluate(self, broadcast: Any, client_ids: list[int], states: dict) -> list[EvalReport]:
        return self.runner.evaluate(broadcast, client_ids, states)

    def node_and_pid(self) -> tuple[str, int]:
        import os

        return ray.get_runtime_context().get_node_id(), os.getpid()


class WorkerPool:
    """A fixed number of ``ClientWorker`` actors, replaced when they fail."""

    def __init__(self, num_workers: int, options: dict[str, Any], init_args: Sequence[Any], *, timeout_s: float | None):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, but got num_workers={num_workers}")
        self._options = options
        self._init_args = tuple(init_args)
        self._timeout_s = timeout_s
        self.workers = [self._spawn() for _ in range(num_workers)]
        self.replacements = 0

    def _spawn(self) -> Any:
        return ClientWorker.options(**self._options).remote(*self._init_args)  # type: ignore[attr-defined]

    def _replace(self, index: int, reason: str, chunk: Sequence[int]) -> None:
        logger.warning(
            "ClientWorker %d failed (%s) while running clients %s; replacing it and re-running them",
            index, reason, _preview(chunk),
        )
        try:
            ray.kill(self.workers[index], no_restart=True)
        except Exception:  # already gone
            pass
        self.workers[index] = self._spawn()
        self.replacements += 1

    def map(
        self, method: str, chunks: Sequence[Sequence[int]], args: Callable[[int], tuple[Any, ...]]
    ) -> list[tuple[list[Any], Any]]:
        """Run ``worker.method(*args(i))`` for every chunk i on idle workers.

        Returns, in chunk order, ``(extra_refs, value)``: ``value`` is the fetched last
        return value and ``extra_refs`` the unfetched other return refs (the
        contribution of ``train``, which goes to the server by reference).
        """
        results: list[tuple[list[Any], Any] | None] = [None] * len(chunks)
        queue = deque(range(len(chunks)))
        idle = deque(range(len(self.workers)))
        inflight: dict[Any, tuple[int, int, list[Any], float]] = {}
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
                except _WORKER_FAILURES as e:
                    self._replace(w, type(e).__name__, chunks[i])
                    queue.appendleft(i)
                else:
                    results[i] = (refs[:-1], value)
                idle.append(w)
            for ref, (i, w, _, started) in list(inflight.items()):
                if self._timeout_s is not None and time.monotonic() - started > self._timeout_s:
                    del inflight[ref]
                    self._replace(w, f"no answer within engine.round_timeout_s={self._timeout_s:g}", chunks[i])
                    queue.appendleft(i)
                    idle.append(w)
        return [r for r in results if r is not None]

    def _poll_s(self) -> float | None:
        return None if self._timeout_s is None else min(1.0, self._timeout_s / 4)

    def shutdown(self) -> None:
        for worker in self.workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception:
                pass
        self.workers = []


def _preview(chunk: Sequence[int], limit: int = 8) -> str:
    ids = list(chunk)
    text = ", ".join(map(str, ids[:limit]))
    return f"[{text}{', ...' if len(ids) > limit else ''}] ({len(ids)} clients)"
