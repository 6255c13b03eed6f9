"""A worker node's share of a round: which calls its workers take (``rayfed.actors.call_queues``), how its agent runs
them (``rayfed.actors.node_agent``), and that the sums it adds up complete to the one-process total bit for bit."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import pytest

from rayfed.actors.call_queues import CallQueues
from rayfed.actors.node_agent import NOT_RUN, NodeAgent, NodeAgents, run_calls
from rayfed.algorithms import WeightedSum
from rayfed.execution.summation import CallTree, tree_sum
from tests.execution.test_summation import _bits, _sums
from tests.waiting import wait_until


def test_each_node_takes_a_stretch_of_consecutive_calls_as_long_as_its_share_of_workers() -> None:
    queues = CallQueues(32, ["a"] * 8 + ["b"] * 8 + ["c"] * 8 + ["d"] * 8)
    assert queues.stretches() == {n: list(range(8 * k, 8 * k + 8)) for k, n in enumerate("abcd")}
    assert [CallTree(32).subtrees(calls) for calls in queues.stretches().values()] == [
        [range(0, 8)],
        [range(8, 16)],
        [range(16, 24)],
        [range(24, 32)],
    ]  # each node sends the server one sum
    uneven = CallQueues(10, ["b", "a", "b", "b"])
    assert uneven.stretches() == {"a": [0, 1], "b": [2, 3, 4, 5, 6, 7, 8, 9]}


def test_a_worker_with_no_call_left_on_its_node_takes_the_last_of_the_longest_stretch() -> None:
    queues = CallQueues(8, ["a", "b"])
    assert [queues.take("a") for _ in range(5)] == [0, 1, 2, 3, 7]  # a's four, then the last of b's
    assert [queues.take("b"), queues.take("c"), queues.take("b"), queues.take("b")] == [4, 6, 5, None]
    lone = CallQueues(3, ["a"])
    assert [lone.take("new node"), lone.take("a"), lone.take("a"), lone.take("a")] == [2, 0, 1, None]


def test_a_failed_call_runs_next_on_its_node_or_wherever_a_worker_is_free() -> None:
    queues = CallQueues(4, ["a", "b"])
    assert queues.take("a") == 0
    queues.put_back(0, "a")
    assert queues.take("a") == 0
    queues.put_back(0, "gone")  # its node left: a worker whose node has no call left takes it
    assert [queues.take("a"), queues.take("a"), queues.take("a")] == [1, 3, 2]
    assert len(queues) == 1 and queues.take("b") == 0 and not len(queues)


def test_calls_wait_in_one_stretch_before_any_worker_has_started() -> None:
    assert CallQueues(3, []).stretches() == {"": [0, 1, 2]}


def _fake_worker(ray):
    """A light stand-in for a ClientWorker: ``train`` returns a ready sum and a reply; it can die or hang on cue."""

    @ray.remote(num_cpus=0)
    class FakeWorker:
        @ray.method(num_returns=2)
        def train(self, part: WeightedSum, fault: str = "") -> tuple[WeightedSum, str]:
            if fault == "die":
                os._exit(1)
            if fault == "hang":
                time.sleep(120)
            return part, f"reply {part.count}"

    return FakeWorker


def _wait_until_dead(ray: Any, actor: Any, limit_s: float = 30.0) -> None:
    """Return once a call to ``actor`` fails as an actor's death does."""

    def dead() -> bool:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=limit_s)
        except ray.exceptions.RayActorError:
            return True
        return False

    wait_until(dead, "the actor's death after ray.kill", limit_s=limit_s, every_s=0.1)


@pytest.mark.timeout(120)
def test_a_node_runs_its_calls_on_its_workers_and_sends_their_sums_once(ray_cluster) -> None:
    # Prepare: seven calls (places 3..9 of a round of 12) on two workers.
    ray = ray_cluster
    parts = _sums(12)
    workers = [(slot, _fake_worker(ray).remote()) for slot in (4, 7)]
    calls = [(k, (parts[3 + k],)) for k in range(7)]
    # Execute: on an agent in its own process, as on a worker node.
    agent = NodeAgent.remote()  # type: ignore[attr-defined]
    sums_ref, outcomes_ref = agent.run.remote("train", calls, workers, None, (12, {k: 3 + k for k in range(7)}))
    sums, outcomes = ray.get([sums_ref, outcomes_ref])
    # Check: every call ran, and the node's sums are the largest subtrees of its calls, which complete to the bits
    # of the whole round added in one process.
    assert sorted((o.call, o.value, o.failure) for o in outcomes) == [(k, "reply 1", "") for k in range(7)]
    assert {o.slot for o in outcomes} <= {4, 7}
    assert list(sums) == [range(3, 4), range(4, 8), range(8, 10)]
    rest = {range(i, i + 1): parts[i] for i in (0, 1, 2, 10, 11)}
    assert _bits(CallTree(12).total({**sums, **rest})) == _bits(tree_sum(parts))
    assert not ray.get(agent.__ray_call__.remote(lambda self: "torch" in sys.modules))  # a light process
    ray.kill(agent)


@pytest.mark.timeout(120)
def test_a_worker_that_dies_or_hangs_leaves_its_call_to_the_driver(ray_cluster) -> None:
    # Prepare: three workers, one dies on its call and one hangs past the timeout; five calls.
    ray = ray_cluster
    parts = _sums(5)
    dying, hanging, healthy = (_fake_worker(ray).remote() for _ in range(3))
    ray.get([w.__ray_ready__.remote() for w in (dying, hanging, healthy)])  # started, as the pool's workers are
    faults = {0: "die", 1: "hang"}
    calls = [(k, (parts[k], faults.get(k, ""))) for k in range(5)]
    # Execute: calls 0, 1 and 2 go to the three workers first, in order.
    sums, outcomes = run_calls(
        "train", calls, [(0, dying), (1, hanging), (2, healthy)], 10.0, (5, {k: k for k in range(5)})
    )
    # Check: the dead worker's and the hung one's calls come back failed, named by their workers' slots; the healthy
    # worker ran the rest, whose sums are the node's.
    by_call = {o.call: o for o in outcomes}
    assert (by_call[0].slot, by_call[0].failure) == (0, "ActorDiedError")
    assert (by_call[1].slot, by_call[1].failure) == (1, "no answer within engine.round_timeout_s=10")
    assert [(by_call[k].slot, by_call[k].value) for k in (2, 3, 4)] == [(2, "reply 1")] * 3
    assert list(sums) == [range(2, 4), range(4, 5)]
    # With no worker left, the calls come back not run.
    ray.kill(healthy)
    _wait_until_dead(ray, healthy)  # ray.kill returns before the actor is gone
    _, outcomes = run_calls("train", calls[2:], [(2, healthy)], None, None)
    assert {o.failure for o in outcomes} <= {"ActorDiedError", NOT_RUN} and NOT_RUN in {o.failure for o in outcomes}
    ray.kill(hanging)


@pytest.mark.timeout(120)
def test_a_node_adds_up_the_sums_of_its_batches_and_a_lost_agent_leaves_them_to_the_server(ray_cluster, caplog) -> None:
    # Prepare: three objects on this node from several of its agent's calls (calls 0-1 added up, calls 2 and 3
    # alone) of a round of six calls, and the node's agent.
    ray = ray_cluster
    parts = _sums(6)
    node = ray.get_runtime_context().get_node_id()
    received = [ray.put({range(0, 2): parts[0] + parts[1]}), ray.put(parts[2]), ray.put(parts[3])]
    spans = [None, range(2, 3), range(3, 4)]
    agents = NodeAgents()
    agent = agents.on(node)
    # Execute
    merged_spans, merged = agents.merge(6, spans, received, [node] * 3, None, round_index=0)
    # Check: one object, the largest subtree of calls 0-3, which completes to the one-process bits.
    assert merged_spans == [None]
    (sums,) = ray.get(merged)
    assert list(sums) == [range(0, 4)]
    assert _bits(CallTree(6).total({**sums, range(4, 5): parts[4], range(5, 6): parts[5]})) == _bits(tree_sum(parts))
    # The agent gone (dead for Ray too): the server is handed the objects as they were, and the log says so.
    ray.kill(agent, no_restart=True)
    _wait_until_dead(ray, agent)
    with caplog.at_level(logging.WARNING, logger="rayfed"):
        assert agents.merge(6, spans, received, [node] * 3, None, round_index=4) == (spans, received)
    assert "round 4: adding up the sums on node" in caplog.text and "the server fetches its 3 objects" in caplog.text
    agents.shutdown()
