"""Folding a round's contributions along the nodes that hold them: one object reaches the server, not one a call.

The server adds the round's partial sums (one per call) left to right, in call order, so that the numbers never
depend on where the calls ran. On a cluster each call's sum sits in the object store of the node that ran it, and
the server fetches every one: W model-sized objects through one network link a round. Folding keeps the same
order and moves fewer bytes: the calls are split into *runs*, maximal stretches of consecutive calls that ran on
one node; a worker on the first run's node adds that run's sums, a worker on the next run's node adds its own to
that total, and so on, so the server receives one object, whose value is the left-to-right sum, bit for bit:

    (((s_0 + s_1) + s_2) + s_3)  =  fold(run 2: fold(run 1: s_0 + s_1) + s_2 + s_3)

This pays when the runs are long, which the pool arranges by handing consecutive calls to the workers of one node
(:class:`rayfed.actors.worker_pool.WorkerPool`). :func:`fold_runs` decides, from where the calls ran alone,
whether folding fetches fewer objects across nodes than the server fetching each sum; it never folds uploads that
are concatenated rather than summed (:attr:`rayfed.algorithms.Contribution.sum_is_one_part`), whose partial
sums would grow at every hop.

The order that makes the sum exact also makes it a chain: each node waits for the total of the nodes before it.
On the 2-core box a hop between two nodes adds about 28 ms of latency (``benchmarks/fold_hop.py``: a chain of
two folds, median 62 ms, against 6 ms for the server fetching the same eight sums), so folding is off unless
``engine.fold_sums`` asks for it: it is for clusters whose head link is the bottleneck (workers x model bytes a
round), not for small models.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["fold_runs", "fetches_unfolded", "fetches_folded"]


def runs_of(nodes: Sequence[str]) -> list[range]:
    """The maximal stretches of consecutive calls that ran on one node, in call order."""
    runs: list[range] = []
    start = 0
    for i in range(1, len(nodes) + 1):
        if i == len(nodes) or nodes[i] != nodes[start]:
            runs.append(range(start, i))
            start = i
    return runs


def fetches_unfolded(nodes: Sequence[str], server_node: str) -> int:
    """Objects that cross nodes when the server fetches every call's sum: those made on another node."""
    return sum(node != server_node for node in nodes)


def fetches_folded(nodes: Sequence[str], server_node: str) -> int:
    """Objects that cross nodes when the calls are folded run by run: each run after the first fetches the total
    before it from the previous run's node, and the server fetches the last total unless it made it."""
    return _fetches_along(runs_of(nodes), nodes, server_node)


def _fetches_along(runs: Sequence[range], nodes: Sequence[str], server_node: str) -> int:
    return len(runs) - 1 + (nodes[runs[-1][0]] != server_node) if runs else 0


def fold_runs(nodes: Sequence[str], server_node: str, *, sums_are_one_part: bool) -> list[range] | None:
    """The runs to fold, in call order, or None when the server should fetch every call's sum itself: when the
    parts are concatenations, or when folding would not move fewer objects across nodes."""
    if not sums_are_one_part:
        return None
    runs = runs_of(nodes)
    return runs if _fetches_along(runs, nodes, server_node) < fetches_unfolded(nodes, server_node) else None
