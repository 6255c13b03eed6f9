"""Which node runs which of a round's calls: consecutive calls to the workers of one node.

A node adds up the calls it ran before the server fetches them, along the summation tree over call indices
(:mod:`rayfed.execution.summation`); the larger the blocks of consecutive calls it holds, the fewer sums it sends on
(an aligned block of calls is one). So the round's calls are split into one stretch of consecutive calls per node,
as long as its share of the started workers, and a node's workers take the calls of its own stretch in order. A
worker whose node has none left takes the last call of the longest other stretch: no worker idles while calls wait,
and the stretch it takes from stays consecutive. Where a call runs never changes the round's numbers, only how many
sums travel.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

__all__ = ["CallQueues"]


class CallQueues:
    """The calls of a round that wait for a worker, one queue per node."""

    def __init__(self, calls: int, worker_nodes: Iterable[str]) -> None:
        """``worker_nodes``: the node of every started worker (a node with k workers appears k times)."""
        counts: dict[str, int] = {}
        for node in worker_nodes:
            counts[node] = counts.get(node, 0) + 1
        nodes = sorted(counts) or [""]
        workers = sum(counts.values())
        self._queues: dict[str, deque[int]] = {}
        start, held = 0, 0
        for node in nodes:
            held += counts.get(node, 1)
            stop = calls * held // (workers or 1)
            self._queues[node] = deque(range(start, stop))
            start = stop

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def take(self, node: str) -> int | None:
        """The next call for a worker on ``node``: the first of its node's stretch, else the last of the longest
        other one; None when no call waits."""
        own = self._queues.get(node)
        if own:
            return own.popleft()
        longest = max(self._queues.values(), key=len)
        return longest.pop() if longest else None

    def take_stretch(self, node: str, most: int) -> list[int]:
        """Calls for the ``most`` free workers of ``node`` at once (its agent runs them): the whole of the node's
        stretch, else up to ``most`` calls from the end of the longest other one."""
        own = self._queues.get(node)
        if own:
            calls = list(own)
            own.clear()
            return calls
        longest = max(self._queues.values(), key=len)
        taken = [longest.pop() for _ in range(min(most, len(longest)))]
        return taken[::-1]

    def put_back(self, call: int, node: str) -> None:
        """A call whose worker on ``node`` failed: it runs next on that node, or on a node that takes it."""
        self._queues.setdefault(node, deque()).appendleft(call)

    def stretches(self) -> dict[str, list[int]]:
        """The calls waiting on each node, in order."""
        return {node: list(queue) for node, queue in self._queues.items()}
