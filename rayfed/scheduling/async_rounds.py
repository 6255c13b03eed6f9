"""Asynchronous aggregation in the round loop: a round per server step, in virtual-time order.

An asynchronous method (FedAsync, FedBuff: a server half that declares
:class:`~rayfed.algorithms.declarations.AsynchronousAggregation`) runs through the same round loop as every
other, one round per model version v (docs/system.md, "Asynchronous aggregation"). Its schedule
(:class:`~rayfed.system.schedule.AsyncSchedule`), simulated ahead of the training, says which clients are launched
from version v and the version each one's update arrives at; in round v:

1. the launched clients whose updates will arrive train as one round (one set of calls, stacked where the method
   stacks) from θ_v, each one's arrival version in ``RoundFacts.arrives_at``;
2. the server keeps their uploads, and makes version v + 1 from the updates that arrive at it
   (:class:`~rayfed.algorithms.common.asynchronous.KeptUpdatesServer`);
3. the round records the step's virtual time, its arrivals (``clients_finished``, their staleness) and the clients
   lost since the previous step (``clients_offline``, ``clients_dropped``).

Clients launched near the run's end train even when their updates arrive after its last version, so that a run
continued with more rounds (``train.rounds`` raised) gives the numbers of one planned with them. A checkpoint saves
the schedule's state after the round's step (:class:`~rayfed.system.schedule.AsyncState`): a resumed run simulates
from it the same events.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rayfed.config import RunConfig
from rayfed.engine.metrics import RoundRecord
from rayfed.execution.round_facts import RoundFacts
from rayfed.scheduling.sync_rounds import Rounds
from rayfed.scheduling.system_records import VIRTUAL_TIME, status_counts, with_status
from rayfed.system.profiles import DeviceProfiles
from rayfed.system.schedule import AsyncSchedule, AsyncState, VersionPlan
from rayfed.system.status import ClientStatus

if TYPE_CHECKING:
    from rayfed.scheduling.workload import ClientStates

__all__ = ["AsyncRounds", "UNBOUNDED"]

UNBOUNDED = 2**62
"""The last version the schedule is simulated to: none, so that every launched update that ever arrives trains."""


class AsyncRounds(Rounds):
    """The rounds of an asynchronous method (module docstring). ``schedule_from(state)`` makes the run's schedule
    from a saved state, or from its start (None)."""

    def __init__(self, config: RunConfig, schedule_from: Callable[[AsyncState | None], AsyncSchedule]) -> None:
        super().__init__(config)
        self.schedule_from = schedule_from
        self.schedule = schedule_from(None)
        self._plan: VersionPlan | None = None
        self._after: AsyncState | None = None
        """The schedule's state after the last round settled: what a checkpoint saves."""

    def devices(self) -> DeviceProfiles:
        return self.schedule.devices

    def _plan_of(self, version: int) -> VersionPlan:
        if self._plan is None or self._plan.version != version:
            self._plan = self.schedule.plan(version)
        return self._plan

    def context(
        self, round_index: int, message: Callable[[], Any] | None = None, states: ClientStates | None = None
    ) -> RoundFacts:
        """The clients launched from version ``round_index`` whose updates arrive, sorted, with their arrival
        versions; the initial model's evaluation (round -1) has round 0's. An asynchronous method's work is alike
        in every round (:func:`~rayfed.scheduling.system_setup.plan_rounds`): ``message`` and ``states`` are unread."""
        config, version = self.config, max(round_index, 0)
        plan = self._plan_of(version)
        arrives = plan.arrives_at >= 0
        order = np.argsort(plan.launched[arrives], kind="stable")
        return RoundFacts(
            round=round_index,
            seed=config.seed,
            lr=config.train.lr_at(version),
            sampled=plan.launched[arrives][order],
            arrives_at=plan.arrives_at[arrives][order],
        )

    def settle(self, round_index: int, record: RoundRecord, clients: pa.Table) -> pa.Table:
        """The step's virtual time, its arrivals and their staleness, its lost clients; in the per-client table the
        status of each client whose update arrived (``finished``, with its ``staleness``) or was lost, a row per event
        (a client that arrived twice in one step has two rows, and participation counts both), each with its launch's
        virtual time (``start_s``), its update's arrival (``finish_s``; null for a lost one, as in a synchronous
        round) and a lost one's loss (``lost_s``: when it dropped out or went offline, freeing its slot), from the
        schedule the server applied."""
        if round_index < 0:
            record.system = {VIRTUAL_TIME: 0.0}
            return clients
        plan = self._plan_of(round_index)
        step = plan.step
        self._after = step.state
        ids = np.concatenate([step.arrived, step.lost])
        status = np.concatenate([np.full(len(step.arrived), ClientStatus.FINISHED, np.int8), step.lost_status])
        staleness = np.concatenate([step.staleness, np.full(len(step.lost), -1)])
        start = np.concatenate([step.arrived_s[:, 0], step.lost_start_s])
        finish = np.concatenate([step.arrived_s[:, 1], np.full(len(step.lost), np.nan)])
        lost = np.concatenate([np.full(len(step.arrived), np.nan), step.lost_s])
        order = np.argsort(ids, kind="stable")  # a client with two events in a step: a row each, in event order
        record.system = {
            VIRTUAL_TIME: step.time_s,
            **status_counts(status),
            "clients_launched": float(len(plan.launched)),
            "staleness_mean": float(step.staleness.mean()) if len(step.staleness) else float("nan"),
            "staleness_max": float(step.staleness.max(initial=0)),
        }
        columns = {
            "staleness": pa.array(staleness[order], mask=staleness[order] < 0),
            "start_s": pa.array(start[order], mask=np.isnan(start[order])),
            "finish_s": pa.array(finish[order], mask=np.isnan(finish[order])),
            "lost_s": pa.array(lost[order], mask=np.isnan(lost[order])),
        }
        return with_status(clients, round_index, ids[order], status[order], columns)

    def state(self) -> dict[str, np.ndarray]:
        return {} if self._after is None else self._after.to_arrays()

    def restore(self, state: Mapping[str, np.ndarray]) -> None:
        self._after = AsyncState.from_arrays(dict(state))
        self.schedule = self.schedule_from(self._after)
        self._plan = None
