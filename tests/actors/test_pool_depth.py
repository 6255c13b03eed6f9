"""A worker of the driver's node holds two calls (the one it runs and the next, queued on the actor), so that it never
waits for the driver between calls, except for a round's last calls, which go to whoever is free; its failure is
charged to the call it was running, and the one queued behind it goes back to the queue as it was. The pool's
bookkeeping, without Ray (fake actors)."""

from __future__ import annotations

from typing import Any

from rayfed.actors.call_queues import CallQueues
from rayfed.actors.node_agent import NodeAgents
from rayfed.actors.pool_calls import DEPTH, Batch, PoolWorker
from rayfed.actors.ray_calls import Flight, InFlight
from rayfed.actors.worker_pool import WorkerPool


class _Method:
    def __init__(self, log: list[tuple[int, Any]], slot: int) -> None:
        self.log, self.slot = log, slot

    def remote(self, *args: Any) -> object:
        self.log.append((self.slot, args))
        return object()  # a ref


class _Actor:
    def __init__(self, log: list[tuple[int, Any]], slot: int) -> None:
        self.train = _Method(log, slot)


def _pool(workers: int) -> tuple[WorkerPool, list[PoolWorker], list[tuple[int, Any]]]:
    pool = WorkerPool.__new__(WorkerPool)
    pool._here, pool._timeout_s, pool._agents = "head", 10.0, NodeAgents()
    log: list[tuple[int, Any]] = []
    members = [PoolWorker(slot, _Actor(log, slot), None, node="head") for slot in range(workers)]
    pool._pool = list(members)
    return pool, members, log


def _flight_of(flights: InFlight[Batch], call: int) -> Flight[Batch]:
    return next(flight for flight in flights if flight.about.calls == [call])


def test_each_worker_takes_its_next_call_before_any_takes_a_second_and_holds_two() -> None:
    pool, (first, second), log = _pool(2)
    queue, flights, idle = CallQueues(5, ["head", "head"]), InFlight[Batch](), [first, second]
    pool._dispatch("train", queue, idle, flights, lambda i: (i,), None)
    assert DEPTH == 2
    assert [call for _, (call,) in log] == [0, 1, 2, 3]
    assert first.running == [0, 2] and second.running == [1, 3] and idle == [] and len(queue) == 1
    # the queued call may wait for the running one: its limit is two calls' time
    assert _flight_of(flights, 2).deadline - _flight_of(flights, 0).deadline > 9.0


def test_the_last_calls_go_one_at_a_time_to_whoever_is_free() -> None:
    # Fewer calls wait than there are workers once each has one: none takes a second it might leave waiting.
    pool, (first, second), log = _pool(2)
    queue, flights, idle = CallQueues(3, ["head", "head"]), InFlight[Batch](), [first, second]
    pool._dispatch("train", queue, idle, flights, lambda i: (i,), None)
    assert first.running == [0] and second.running == [1] and len(queue) == 1 and idle == [first, second]
    pool._ran(_flight_of(flights, 1).about, _flight_of(flights, 1), "reply", lambda *_: None, idle)
    pool._dispatch("train", queue, idle, flights, lambda i: (i,), None)
    assert second.running == [2] and first.running == [0]


def test_a_failure_is_the_running_calls_and_the_queued_one_goes_back_uncounted() -> None:
    pool, (first, second), _ = _pool(2)
    queue, flights, idle = CallQueues(5, ["head", "head"]), InFlight[Batch](), [first, second]
    pool._dispatch("train", queue, idle, flights, lambda i: (i,), None)
    charged: list[int] = []
    done: list[int] = []

    def failed(i: int, node: str, reason: str, worker: PoolWorker | None) -> None:
        charged.append(i)
        queue.put_back(i, node)

    def record(i: int, node: str, value: Any, refs: list[Any], by_agent: bool) -> None:
        done.append(i)

    # Execute: the first worker dies; the reply of its queued call (2) is read first, then that of its running one.
    pool._lost(_flight_of(flights, 2).about, "ActorDiedError", failed, idle, queue)
    pool._lost(_flight_of(flights, 0).about, "ActorDiedError", failed, idle, queue)
    pool._ran(_flight_of(flights, 1).about, _flight_of(flights, 1), "reply", record, idle)
    # Assert: call 0 was charged once; calls 0 and 2 wait again, in order, before call 4; the other worker goes on.
    assert charged == [0] and first.running == []
    assert queue.stretches() == {"head": [0, 2, 4]}
    assert done == [1] and second.running == [3] and idle == [second]
