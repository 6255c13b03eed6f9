"""What a stack of clients trains on, step by step: :class:`StackPlan`.

Every client's batches (:class:`~rayfed.train.batches.ClientBatches`) laid out in the stack's lanes
(:mod:`rayfed.train.lanes`: a client a lane, or packed, a lane taking its next client when one finishes), the lanes
longest first, so the lanes still training are always a prefix of the stack; everything a step reads of it
reaches the device in one transfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rayfed.train.batches import ClientBatches
from rayfed.train.host import to_device
from rayfed.train.lanes import Lanes, one_lane_each, packed_lanes

__all__ = ["StackPlan", "Switch"]


@dataclass(frozen=True)
class Switch:
    """At its step, ``lane``'s client finished: it goes to the outcome's ``slot`` and ``client`` takes the lane."""

    lane: int
    client: int
    slot: int


@dataclass(frozen=True)
class StackPlan:
    """Which samples every lane of a stack trains on at every step (:class:`~rayfed.train.lanes.Lanes`), and where
    each client's results go.

    A stack's outcome has a slot per client: a lane's last client the lane's slot (the lanes that finish when the
    stack narrows fill their own slots), the clients that hand their lane on (:attr:`switches`) the slots after
    the lanes', the clients without a step the last slots (they keep their starting values)."""

    lanes: Lanes
    steps: list[int]
    """Each client's step count, in the clients' order."""
    active: list[int]
    """At every stacked step, how many lanes (a prefix of the stack) take a step."""
    batch: int
    index: torch.Tensor
    """(steps, batch, lanes) sample indices into the clients' samples laid end to end in the clients' order."""
    weight: torch.Tensor | None
    """(steps, batch, lanes) 1 for a sample, 0 for padding; None when every batch is full."""
    draws: torch.Tensor | None
    """(steps, views, batch, lanes, draws) each sample's view draws; None without augmentation."""
    switches: dict[int, list[Switch]]
    """At a stacked step, the lanes whose client finished and the client each takes next."""
    slot_clients: list[int]
    """Each slot's client."""
    back: torch.Tensor
    """For each client, its slot."""
    slot_index: torch.Tensor
    """:attr:`slot_clients` on the device."""
    first_index: torch.Tensor
    """Each lane's first client, on the device: the stack's rows at its first step."""
    extra: list[torch.Tensor]
    """The host arrays :meth:`of` was asked to bring along, on the device."""

    @property
    def first(self) -> list[int]:
        """Each lane's first client."""
        return [lane[0] for lane in self.lanes.clients]

    @classmethod
    def of(
        cls,
        batches: Sequence[ClientBatches],
        sizes: Sequence[int],
        device: torch.device,
        extra: Sequence[np.ndarray] = (),
        packed: bool = False,
    ) -> StackPlan:
        """The plan of clients with ``batches`` over ``sizes`` samples each, one lane each or ``packed``
        (:func:`~rayfed.train.lanes.packed_lanes`); ``extra`` host arrays ride along in the same transfer."""
        steps = [b.steps for b in batches]
        lanes = packed_lanes(steps) if packed else one_lane_each(steps)
        stacked, batch, width = lanes.stacked_steps, batches[0].index.shape[1], len(lanes.clients)
        index = np.zeros((stacked, batch, width), dtype=np.int64)
        weight = np.zeros((stacked, batch, width), dtype=np.float32)
        draws = None
        if batches[0].draws is not None:
            views, drawn = batches[0].draws.shape[1], batches[0].draws.shape[3]
            draws = np.zeros((stacked, views, batch, width, drawn))
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        takes: dict[int, list[tuple[int, int]]] = {}
        for column, lane in enumerate(lanes.clients):
            at = 0
            for c in lane:
                own, stop = batches[c], at + steps[c]
                index[at:stop, :, column] = own.index + offsets[c]
                weight[at:stop, :, column] = own.weight()
                if draws is not None and own.draws is not None:
                    draws[at:stop, :, :, column] = own.draws
                if at:
                    takes.setdefault(at, []).append((column, c))
                at = stop
        loads = lanes.loads
        active = [sum(1 for load in loads if load > s) for s in range(stacked)]
        switches, slot_clients = _switches(lanes, takes)
        slot_clients += [c for c in range(len(steps)) if steps[c] == 0]
        padded = any(b.padded for b in batches)
        back = np.empty(len(batches), dtype=np.int64)
        back[slot_clients] = np.arange(len(batches))
        optional = [a for a in (weight if padded else None, draws) if a is not None]
        first = [np.asarray([lane[0] for lane in lanes.clients], np.int64)] if lanes.packed else []
        moved = to_device([index, back, np.asarray(slot_clients, np.int64), *first, *optional, *extra], device)
        at = 3 + len(first)
        moved_weight = moved[at] if padded else None
        moved_draws = moved[at + padded] if draws is not None else None
        slots = moved[2]  # one client a lane: its first is its last, in the lane's slot
        first_index = moved[3] if lanes.packed else slots if width == len(batches) else slots[:width]
        return cls(
            lanes,
            steps,
            active,
            batch,
            moved[0],
            moved_weight,
            moved_draws,
            switches,
            slot_clients,
            moved[1],
            moved[2],
            first_index,
            moved[len(moved) - len(extra) :],
        )


def _switches(lanes: Lanes, takes: dict[int, list[tuple[int, int]]]) -> tuple[dict[int, list[Switch]], list[int]]:
    """The switches of lanes between their clients, and each slot's client: a lane's last client in the lane's
    slot, the clients before it, lane by lane, in the slots after the lanes'."""
    slot_clients = [lane[-1] for lane in lanes.clients]
    switches: dict[int, list[Switch]] = {}
    current = [lane[0] for lane in lanes.clients]
    for s in sorted(takes):
        for lane, client in takes[s]:
            switches.setdefault(s, []).append(Switch(lane, client, len(slot_clients)))
            slot_clients.append(current[lane])
            current[lane] = client
    return switches, slot_clients
