"""Which client trains in which lane of a stack, and when: :class:`Lanes`.

A stack's lane is one client's slot of its width. One client a lane (:func:`one_lane_each`), the stack runs as
long as its longest client and the lanes of shorter clients idle once they finish: the papers' MNIST protocol
(20 clients, Dirichlet 0.1) keeps its lanes 56 % busy. Packed (:func:`packed_lanes`), a lane takes its next
client when its current one finishes, and the clients are spread over lanes, longest first into the first lane
with room (the MULTIFIT rule of multiprocessor scheduling: Coffman, Garey and Johnson 1978), in the layout that
keeps its lanes busiest of those that finish within :data:`LANE_SLACK` of the longest client's steps: the same
call in about as many stacked steps, on about half the lanes.

The lanes are ordered by their steps, longest first, so the lanes still training are always a prefix of the stack
(the stack narrows as today when its last lanes finish). :func:`occupancy` measures a layout:
useful client-steps / (lanes × stacked steps). :func:`equal_length_groups`, the other way to fill lanes (stacks
of clients with about equal step counts, one after the other), is kept for the measurement of
``benchmarks/packing.py`` and docs/architecture.md ("How clients and runs are packed").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LANE_SLACK", "Lanes", "one_lane_each", "packed_lanes", "occupancy", "equal_length_groups"]

LANE_SLACK = 0.05
"""How many more stacked steps than its longest client a packed call may take to need fewer lanes."""


@dataclass(frozen=True)
class Lanes:
    """The clients of each lane in the order they train, the lanes longest first; clients without a step are in
    none."""

    clients: tuple[tuple[int, ...], ...]
    steps: tuple[int, ...]
    """Every client's step count, by position."""

    @property
    def loads(self) -> list[int]:
        """Each lane's steps."""
        return [sum(self.steps[c] for c in lane) for lane in self.clients]

    @property
    def stacked_steps(self) -> int:
        return max(self.loads, default=0)

    @property
    def packed(self) -> bool:
        """Whether some lane trains more than one client."""
        return any(len(lane) > 1 for lane in self.clients)


def _ordered(steps: Sequence[int], lanes: list[list[int]]) -> Lanes:
    loads = [sum(steps[c] for c in lane) for lane in lanes]
    by_load = sorted(range(len(lanes)), key=lambda i: -loads[i])
    return Lanes(tuple(tuple(lanes[i]) for i in by_load), tuple(steps))


def _longest_first(steps: Sequence[int]) -> list[int]:
    """The clients with a step, longest first (ties in position order)."""
    return sorted((c for c in range(len(steps)) if steps[c] > 0), key=lambda c: -steps[c])


def one_lane_each(steps: Sequence[int]) -> Lanes:
    """Every client with a step in a lane of its own, longest first: the stack of one call as it trained before
    lanes were packed."""
    return Lanes(tuple((c,) for c in _longest_first(steps)), tuple(steps))


def _first_fit(steps: Sequence[int], order: Sequence[int], capacity: int) -> list[list[int]]:
    """The clients in ``order`` each into the first lane with room for it within ``capacity`` steps, a new lane
    where none has."""
    lanes: list[list[int]] = []
    loads: list[int] = []
    for c in order:
        lane = next((i for i, load in enumerate(loads) if load + steps[c] <= capacity), len(lanes))
        if lane == len(lanes):
            lanes.append([])
            loads.append(0)
        lanes[lane].append(c)
        loads[lane] += steps[c]
    return lanes


def _multifit(steps: Sequence[int], count: int) -> list[list[int]]:
    """The clients over at most ``count`` lanes with the fewest stacked steps that first-fit, longest first, finds
    (MULTIFIT: Coffman, Garey and Johnson 1978, a bisection over the lanes' capacity)."""
    order = _longest_first(steps)
    longest, total = steps[order[0]], sum(steps[c] for c in order)
    low, high = max(longest, math.ceil(total / count)), max(longest, 2 * math.ceil(total / count))
    best = [[c] for c in order] if count >= len(order) else _first_fit(steps, order, high)
    while low <= high:
        middle = (low + high) // 2
        lanes = _first_fit(steps, order, middle)
        if len(lanes) <= count:
            best, high = lanes, middle - 1
        else:
            low = middle + 1
    return best


def packed_lanes(steps: Sequence[int], slack: float = LANE_SLACK) -> Lanes:
    """Of the layouts that finish within ``(1 + slack)`` times the longest client's steps, the one that keeps its
    lanes busiest (:func:`occupancy`), fewer lanes on a tie (module docstring)."""
    order = _longest_first(steps)
    if not order:
        return Lanes((), tuple(steps))
    longest = steps[order[0]]
    best = one_lane_each(steps)
    for count in range(max(1, math.ceil(sum(steps) / ((1 + slack) * longest))), len(order)):
        layout = _ordered(steps, _multifit(steps, count))
        if layout.stacked_steps <= (1 + slack) * longest and occupancy(layout) >= occupancy(best):
            best = layout
    return best


def occupancy(lanes: Lanes) -> float:
    """Useful client-steps over lane-steps: sum of the steps / (lanes × stacked steps); 1 for no step at all."""
    width, stacked = len(lanes.clients), lanes.stacked_steps
    return sum(lanes.steps) / (width * stacked) if width and stacked else 1.0


def equal_length_groups(steps: Sequence[int], tolerance: float) -> list[list[int]]:
    """The other way to fill lanes: the clients, longest first, in stacks of one lane each whose shortest client
    takes at least ``(1 - tolerance)`` of its longest one's steps, trained one stack after another."""
    groups: list[list[int]] = []
    for c in _longest_first(steps):
        if groups and steps[c] >= (1 - tolerance) * steps[groups[-1][0]]:
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups
