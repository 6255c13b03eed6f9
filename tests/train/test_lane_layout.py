"""How a stack's clients are laid out in lanes (:mod:`rayfed.train.lanes`)."""

from __future__ import annotations

import pytest

from rayfed.train.lanes import equal_length_groups, occupancy, one_lane_each, packed_lanes

DIRICHLET = [197, 37, 122, 190, 143, 464, 94, 95, 270, 300, 233, 282, 270, 160, 429, 408, 272, 423, 394, 457]
PATHOLOGICAL = [175, 98, 234, 599, 99, 154, 75, 730, 228, 218, 141, 397, 113, 175, 144, 629, 148, 142, 125, 616]


@pytest.mark.parametrize("steps", [DIRICHLET, PATHOLOGICAL, [5, 3, 3, 0, 2], [4], [0, 0], list(range(1, 30))])
def test_packed_lanes_hold_every_client_once_longest_lane_first_within_the_slack(steps: list[int]) -> None:
    lanes = packed_lanes(steps)
    placed = sorted(c for lane in lanes.clients for c in lane)
    assert placed == [c for c in range(len(steps)) if steps[c]]  # every client with a step, once
    assert lanes.loads == sorted(lanes.loads, reverse=True)  # the lanes still training are a prefix
    assert lanes.stacked_steps <= 1.05 * max(steps)
    assert occupancy(lanes) >= occupancy(one_lane_each(steps))


def test_packing_fills_the_mnist_protocols_lanes() -> None:
    assert round(occupancy(one_lane_each(DIRICHLET)), 3) == 0.565
    assert round(occupancy(one_lane_each(PATHOLOGICAL)), 3) == 0.359
    dirichlet, pathological = packed_lanes(DIRICHLET), packed_lanes(PATHOLOGICAL)
    assert (len(dirichlet.clients), dirichlet.stacked_steps) == (12, 464)  # as long as before, on 12 lanes of 20
    assert occupancy(dirichlet) > 0.94 and occupancy(pathological) > 0.98
    assert occupancy(packed_lanes(DIRICHLET, slack=0.3)) > 0.97


def test_stacks_of_equal_length_take_many_more_stacked_steps() -> None:
    groups = equal_length_groups(DIRICHLET, 0.05)
    assert sorted(c for group in groups for c in group) == list(range(20))
    assert all(DIRICHLET[group[-1]] >= 0.95 * DIRICHLET[group[0]] for group in groups)
    assert sum(DIRICHLET[group[0]] for group in groups) > 6 * max(DIRICHLET)
