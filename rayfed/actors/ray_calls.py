"""Actor calls in flight, and how they are awaited: what the driver's pool and the node agents share.

Calls that end together are collected in one wait and their replies fetched in one ``ray.get``; a call whose actor is
gone yields its failure in place of its value; a call past its deadline is overdue. Nothing here imports torch: the
node agents (:mod:`rayfed.actors.node_agent`) run in light processes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, WorkerCrashedError

__all__ = ["ACTOR_FAILURES", "POLL_S", "InFlight", "Flight", "kill_actor", "timeout_text", "values_or_failures"]

ACTOR_FAILURES = (RayActorError, ActorDiedError, ActorUnavailableError, WorkerCrashedError)
"""What a call raises when its actor's process is gone (killed, out of memory, crashed) or unreachable."""
POLL_S = 1.0
"""The longest a wait for replies lasts before deadlines and the cluster's size are looked at again."""

T = TypeVar("T")


@dataclass
class Flight(Generic[T]):
    """One call in flight: what it is about, its return refs (the last one is awaited), when it is overdue."""

    about: T
    refs: list[Any]
    deadline: float


class InFlight(Generic[T]):
    """Calls in flight, keyed by their awaited ref."""

    def __init__(self) -> None:
        self._flights: dict[Any, Flight[T]] = {}

    def __len__(self) -> int:
        return len(self._flights)

    def __iter__(self):
        return iter(self._flights.values())

    def add(self, about: T, refs: Any, timeout_s: float | None) -> None:
        """A call made: ``refs`` its return ref(s), ``timeout_s`` how long it may take (None: no limit)."""
        refs = list(refs) if isinstance(refs, (list, tuple)) else [refs]
        deadline = float("inf") if timeout_s is None else time.monotonic() + timeout_s
        self._flights[refs[-1]] = Flight(about, refs, deadline)

    def answered(self, also: Iterable[Any] = (), timeout_s: float = POLL_S) -> tuple[list[tuple[Flight[T], Any]], list]:
        """Wait up to ``timeout_s`` for a reply (or one of the refs ``also``), then take every other one there by
        then, fetched together: each answered flight with its value (or the failure of its actor), and the refs of
        ``also`` that are ready."""
        extra = list(also)
        refs = [*self._flights, *extra]
        if not refs:
            return [], []
        ready, rest = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        replies = [ref for ref in ready if ref in self._flights]
        flights = [self._flights.pop(ref) for ref in replies]
        others = set(extra)
        return list(zip(flights, values_or_failures(replies))), [ref for ref in ready if ref in others]

    def overdue(self) -> list[Flight[T]]:
        """The flights past their deadline, no longer awaited."""
        now = time.monotonic()
        late = [ref for ref, flight in self._flights.items() if flight.deadline < now]
        return [self._flights.pop(ref) for ref in late]

    def forget(self, which: Callable[[T], bool]) -> list[Flight[T]]:
        """Stop awaiting the flights whose ``about`` ``which`` picks; returns them."""
        picked = [ref for ref, flight in self._flights.items() if which(flight.about)]
        return [self._flights.pop(ref) for ref in picked]

    def clear(self) -> list[Flight[T]]:
        """Stop awaiting every flight; returns them."""
        flights = list(self._flights.values())
        self._flights.clear()
        return flights


def values_or_failures(refs: list[Any]) -> list[Any]:
    """The values of ready ``refs``, fetched together; where an actor failed, its error in place of its value."""
    try:
        return ray.get(refs)
    except ACTOR_FAILURES:
        return [_value_or_failure(ref) for ref in refs]


def _value_or_failure(ref: Any) -> Any:
    try:
        return ray.get(ref)
    except ACTOR_FAILURES as e:
        return e


def timeout_text(timeout_s: float | None) -> str:
    return f"no answer within engine.round_timeout_s={timeout_s:g}"


def kill_actor(actor: Any) -> None:
    """End ``actor`` for good; nothing happens if it is already gone."""
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already gone
        pass
