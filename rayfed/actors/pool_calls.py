"""What the driver's :class:`~rayfed.actors.worker_pool.WorkerPool` keeps of its workers and their calls: a worker
and the calls it holds, calls in flight together, a call's result.

A worker holds up to :data:`DEPTH` calls: the one it runs and the next, which Ray queues on the actor. Its failure is
charged to the call it was running (the first it holds); those queued behind it go back to the round's queue as they
were (:meth:`~rayfed.actors.worker_pool.WorkerPool.map`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEPTH", "CallResult", "PoolWorker", "Batch", "place", "preview"]

DEPTH = 2
"""Calls a worker holds at once: the one it runs and the one it runs next. Between two calls a worker called one at a
time idles until its caller hears of the first and sends the second (a few milliseconds, a core's worth on a busy
box). A worker takes its second call only while at least as many calls wait as there are workers: the last calls of
a round go one at a time to whichever worker is free, so that none idles at the end while another still holds a
call it has not started."""


@dataclass(frozen=True)
class CallResult:
    """One chunk's call: the fetched last return value, the other return refs (unfetched), where it ran."""

    refs: list[Any]
    """The other return refs: ``train``'s contribution, which goes to the server by reference; for a call run by a
    node's agent, the sums of the node's calls (shared by the calls it ran)."""
    value: Any
    node: str
    """The Ray node that ran it, whose object store holds ``refs`` until someone fetches them."""
    summed_on_node: bool = False
    """True if ``refs`` holds its node's sums, keyed by the calls they span, rather than this call's own."""


@dataclass(eq=False)
class PoolWorker:
    """One ``ClientWorker`` actor: its slot (the name in messages, kept by its replacement) and its start."""

    slot: int
    actor: Any
    ready: Any
    """``actor.node_and_pid`` ref: resolves once Ray has placed the actor and its constructor ran."""
    node: str = field(default="")
    """Its node's id, once started ("" before)."""
    running: list[int] = field(default_factory=list)
    """The calls of the driver's node given to it and not answered yet, in the order it runs them."""


@dataclass
class Batch:
    """Calls in flight together: one call of a worker of the driver's node, or a node's stretch on its agent."""

    calls: list[int]
    workers: list[PoolWorker]
    node: str
    by_agent: bool


def place(batch: Batch) -> int:
    """Where a call of the driver's node stands among its worker's calls (0 for an agent's): replies are read in
    the order the worker ran them, so that a failure is charged to the call that was running."""
    running = [] if batch.by_agent else batch.workers[0].running
    return running.index(batch.calls[0]) if batch.calls[0] in running else 0


def preview(chunk: Sequence[int], limit: int = 8) -> str:
    ids = list(chunk)
    text = ", ".join(map(str, ids[:limit]))
    return f"[{text}{', ...' if len(ids) > limit else ''}] ({len(ids)} clients)"
