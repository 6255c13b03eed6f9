"""``NodeAgent``: the driver's one call a round to a worker node, which runs that node's share of the calls.

The driver hands each worker node other than its own its stretch of the round's calls and its idle workers in one
call (:class:`rayfed.actors.worker_pool.WorkerPool`). The node's agent gives the calls to those workers as they become
free, collects their replies in few waits, and answers with two objects: the sums of the largest subtrees of the
calls that ran there, added along the round's summation tree (:meth:`rayfed.execution.summation.CallTree.reduce`)
from the node's own object store, which stay on the node until the server fetches them, one object a node; and every
call's :class:`Outcome`, which the driver reads. The driver and the server so do work per node and per round; what
grows with the workers (calls, waits, replies, additions) happens on the workers' nodes, on all of them at once.

A worker that dies or overruns ``engine.round_timeout_s`` gets no further call: its outcome says why, and the driver
drops the worker and runs the call again elsewhere. Calls still waiting when the node has no worker left come back
not run. The agent asks Ray for no CPU and imports no torch; a round's sums never depend on which node added what.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayfed.actors.ray_calls import ACTOR_FAILURES, POLL_S, InFlight, kill_actor, timeout_text
from rayfed.execution.summation import CallTree, pieces_of

logger = logging.getLogger(__name__)

__all__ = ["NodeAgent", "NodeAgents", "Outcome", "NOT_RUN", "run_calls"]

NOT_RUN = "not run: the node had no worker left"


@dataclass(frozen=True)
class Outcome:
    """What became of one call: its reply, or why it has none."""

    call: int
    """The call's index in the driver's batch."""
    slot: int
    """The slot of the worker that ran it; -1 if none did."""
    value: Any = None
    failure: str = ""
    """Why it failed ("" when it ran): its worker died or overran, or it was :data:`NOT_RUN`."""


def run_calls(
    method: str,
    calls: Sequence[tuple[int, tuple[Any, ...]]],
    workers: Sequence[tuple[int, Any]],
    timeout_s: float | None,
    tree: tuple[int, dict[int, int]] | None = None,
) -> tuple[dict[range, Any] | None, list[Outcome]]:
    """Run ``worker.method(*args)`` for every ``(call, args)`` of ``calls`` on ``workers`` (``(slot, actor)``), each
    worker taking the next call when free. With ``tree`` (the round's number of calls, each call's place among them),
    the calls' first return values are sums, added up along the round's tree. Returns (those sums, or None; every
    call's outcome)."""
    idle, waiting = deque(workers), deque(calls)
    flights: InFlight[tuple[int, tuple[int, Any]]] = InFlight()
    outcomes: list[Outcome] = []
    sums: dict[int, Any] = {}
    while waiting or len(flights):
        while waiting and idle:
            worker, (call, args) = idle.popleft(), waiting.popleft()
            flights.add((call, worker), getattr(worker[1], method).remote(*args), timeout_s)
        answered, _ = flights.answered(timeout_s=POLL_S if timeout_s is None else min(POLL_S, timeout_s / 4))
        for flight, value in answered:
            call, worker = flight.about
            if isinstance(value, ACTOR_FAILURES):
                outcomes.append(Outcome(call, worker[0], failure=type(value).__name__))
                continue
            outcomes.append(Outcome(call, worker[0], value))
            idle.append(worker)
            if tree is not None:
                sums[tree[1][call]] = flight.refs[0]
        for flight in flights.overdue():
            call, worker = flight.about
            outcomes.append(Outcome(call, worker[0], failure=timeout_text(timeout_s)))
        if not idle and not len(flights):
            break
    outcomes.extend(Outcome(call, -1, failure=NOT_RUN) for call, _ in waiting)
    if tree is None or not sums:
        return None, outcomes
    places = sorted(sums)
    parts = ray.get([sums[place] for place in places])  # made on this node: read from its store without a copy
    return CallTree(tree[0]).reduce({range(p, p + 1): part for p, part in zip(places, parts)}), outcomes


@ray.remote(num_cpus=0, max_restarts=0)
class NodeAgent:
    """Ray actor placed on one worker node, running :func:`run_calls` there."""

    def __init__(self, config: Any = None) -> None:
        """``config`` is the run's config, unpickled here (from the one copy in the object store) only so that the
        run's code outside rayfed is imported in this process, as in its workers (:mod:`rayfed.util.plugins`):
        the sums it reads back and adds up may be instances of that code's classes."""

    @ray.method(num_returns=2)
    def run(
        self,
        method: str,
        calls: list[tuple[int, tuple[Any, ...]]],
        workers: list[tuple[int, Any]],
        timeout_s: float | None,
        tree: tuple[int, dict[int, int]] | None = None,
    ) -> tuple[dict[range, Any] | None, list[Outcome]]:
        return run_calls(method, calls, workers, timeout_s, tree)

    @ray.method(num_returns=2)
    def merge(self, calls: int, spans: list[range | None], *received: Any) -> tuple[dict[range, Any], int]:
        """Returns (the largest subtrees of the round's ``calls`` calls that the sums ``received`` on this node
        span, added up; how many objects there were): one object in place of several agent calls' sums."""
        return CallTree(calls).reduce(pieces_of(spans, received)), len(received)


class NodeAgents:
    """The driver's agents, one per worker node, each started on its node (strictly) when first needed, with
    ``config`` (the run's config, or its object-store reference: :class:`NodeAgent`)."""

    def __init__(self, config: Any = None) -> None:
        self._agents: dict[str, Any] = {}
        self._config = config

    def on(self, node: str) -> Any:
        """The agent of ``node``."""
        if node not in self._agents:
            here = NodeAffinitySchedulingStrategy(node, soft=False)
            self._agents[node] = NodeAgent.options(scheduling_strategy=here).remote(self._config)  # type: ignore[attr-defined]
        return self._agents[node]

    def started(self) -> dict[str, Any]:
        return dict(self._agents)

    def forget(self, node: str) -> None:
        """End the agent of ``node`` (its node left, it failed, or the node has no worker left)."""
        agent = self._agents.pop(node, None)
        if agent is not None:
            kill_actor(agent)

    def merge(
        self,
        calls: int,
        spans: Sequence[range | None],
        received: Sequence[Any],
        nodes: Sequence[str],
        timeout_s: float | None,
        round_index: int,
    ) -> tuple[list[range | None], list[Any]]:
        """What the server fetches of the sums ``received`` (refs named by ``spans``, as
        :func:`~rayfed.execution.summation.pieces_of` reads them) made on ``nodes``: where an agent's node holds
        more than one (its calls ran in several of its calls, as while the pool grows or after a failure), one
        object that the agent adds up from its store, all nodes at once; every other one as it is. A node whose
        addition fails or exceeds ``timeout_s`` leaves the server its objects: the same total, to the last bit."""
        held: dict[str, list[int]] = {}
        for k, node in enumerate(nodes):
            held.setdefault(node, []).append(k)
        merges = {
            node: self._agents[node].merge.remote(calls, [spans[k] for k in ks], *(received[k] for k in ks))
            for node, ks in held.items()
            if len(ks) > 1 and node in self._agents
        }
        acks = [ack for _, ack in merges.values()]
        done = ray.wait(acks, num_returns=len(acks), timeout=timeout_s)[0] if acks else []
        answers = {ack: _answer(ack) for ack in done}
        out_spans: list[range | None] = []
        out: list[Any] = []
        for node, ks in held.items():
            merged, ack = merges.get(node, (None, None))
            answer = answers[ack] if ack in answers else TimeoutError(timeout_text(timeout_s)) if ack else None
            if ack is not None and not isinstance(answer, Exception):
                out_spans.append(None)
                out.append(merged)
                continue
            if ack is not None:
                logger.warning(
                    "round %d: adding up the sums on node %s failed (%s); the server fetches its %d objects itself",
                    round_index,
                    node[:8],
                    answer if isinstance(answer, TimeoutError) else type(answer).__name__,
                    len(ks),
                )
            out_spans.extend(spans[k] for k in ks)
            out.extend(received[k] for k in ks)
        return out_spans, out

    def shutdown(self) -> None:
        for node in list(self._agents):
            self.forget(node)


def _answer(ref: Any) -> Any:
    """The value of a ready ``ref``, or the error it holds (its actor died, or an object it read was lost)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as e:
        return e
