"""``NodeAgent``: the driver's one call a round to a worker node, which runs that node's share of the calls.

The driver hands each worker node other than its own its stretch of the round's calls and its idle workers in one
call (:class:`rayfed.actors.worker_pool.WorkerPool`). The node's agent gives the calls to those workers as they become
free, collects their replies in few waits, and answers with two objects: the sums of the largest subtrees of the
calls that ran there, added along the round's summation tree (:meth:`rayfed.execution.summation.CallTree.reduce`)
from the node's own object store, which stay on the node until the server fetches them, one object a node; and every
call's :class:`Outcome`, which the driver reads. The driver and the server so do work per node and per round; what
grows with the workers (calls, waits, replies, additions) happens on the workers' nodes, on all of them at once.

Each worker holds up to two calls, the one it runs and the next, as the driver's own node's workers do. A worker that
dies or overruns ``engine.round_timeout_s`` gets no further call: its running call's outcome says why, and the
driver drops the worker and runs the call again elsewhere; the call it held behind that one waits for the node's
other workers, and the calls still waiting when the node has no worker left come back not run. The agent asks Ray
for no CPU and imports no torch; a round's sums never depend on which node added what.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayfed.actors.pool_calls import DEPTH
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
    worker holding up to :data:`~rayfed.actors.pool_calls.DEPTH` calls (the one it runs and the next). With ``tree``
    (the round's number of calls, each call's place among them), the calls' first return values are sums, added up
    along the round's tree. Returns (those sums, or None; every call's outcome). A worker's failure is its running
    call's; the calls it held behind that one wait again for the node's other workers."""
    actors, waiting, args_of = dict(workers), deque(calls), dict(calls)
    held: dict[int, list[int]] = {slot: [] for slot, _ in workers}
    """The calls each worker still able to run holds, in the order it runs them."""
    flights: InFlight[tuple[int, int]] = InFlight()
    outcomes: list[Outcome] = []
    sums: dict[int, Any] = {}

    def fail(slot: int, why: str) -> None:
        """The worker in ``slot`` failed (died, or overran its running call): it gets no more calls, and those it
        held behind its running one wait again."""
        running, *behind = held.pop(slot)
        outcomes.append(Outcome(running, slot, failure=why))
        waiting.extendleft((call, args_of[call]) for call in reversed(behind))
        flights.forget(lambda about: about[1] == slot)

    while waiting or len(flights):
        while waiting and (free := [slot for slot, calls in held.items() if len(calls) < DEPTH]):
            slot = min(free, key=lambda s: len(held[s]))
            if held[slot] and len(waiting) < len(held):  # the last calls: one at a time, to whoever is free
                break
            (call, args), limit = waiting.popleft(), None if timeout_s is None else timeout_s * (len(held[slot]) + 1)
            held[slot].append(call)
            flights.add((call, slot), getattr(actors[slot], method).remote(*args), limit)
        answered, _ = flights.answered(timeout_s=POLL_S if timeout_s is None else min(POLL_S, timeout_s / 4))
        answered.sort(key=lambda answer: _place(held, *answer[0].about))
        for flight, value in answered:
            call, slot = flight.about
            if call not in held.get(slot, ()):  # its worker failed already: the call went back to wait
                continue
            if isinstance(value, ACTOR_FAILURES):
                fail(slot, type(value).__name__)
                continue
            held[slot].remove(call)
            outcomes.append(Outcome(call, slot, value))
            if tree is not None:
                sums[tree[1][call]] = flight.refs[0]
        for flight in flights.overdue():
            call, slot = flight.about
            if call in held.get(slot, ()):
                fail(slot, timeout_text(timeout_s))
        if not held and not len(flights):
            break
    outcomes.extend(Outcome(call, -1, failure=NOT_RUN) for call, _ in waiting)
    if tree is None or not sums:
        return None, outcomes
    places = sorted(sums)
    parts = ray.get([sums[place] for place in places])  # made on this node: read from its store without a copy
    return CallTree(tree[0]).reduce({range(p, p + 1): part for p, part in zip(places, parts)}), outcomes


def _place(held: dict[int, list[int]], call: int, slot: int) -> int:
    """Where ``call`` stands among its worker's calls: replies are read in the order the worker ran them."""
    calls = held.get(slot, [])
    return calls.index(call) if call in calls else 0


@ray.remote(num_cpus=0, max_restarts=0)
class NodeAgent:
    """Ray actor placed on one worker node, running :func:`run_calls` there."""

    def __init__(self, config: Any = None) -> None:
        """``config`` is the run's config with its code beside it (:class:`~rayfed.util.plugins.WithCode`), unpickled
        here (from the one copy in the object store) only so that the run's code outside rayfed is imported in this
        process, as in its workers (:mod:`rayfed.util.plugins`):
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
