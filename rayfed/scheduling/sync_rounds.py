"""Whom each round trains, and what the round's system model records of it: what the round loop asks each round.

The round loop (:mod:`rayfed.engine.simulation`) is written once; a :class:`Rounds` tells it, each round, the
round's context (:meth:`Rounds.context`: the clients that train, their learning rate, any step budgets) and, once
the round is summarised, adds what the system model knows of it to its records (:meth:`Rounds.settle`). Its
:meth:`~Rounds.state` is what a checkpoint saves of it, so a resumed run asks the same.

* :class:`Rounds`: no system model (``system.devices="off"``): ``engine.join_ratio``'s sample (a fixed number, or
  each client with that probability: ``engine.participation``), nothing more;
* :class:`VirtualRounds`: synchronous rounds in virtual time (:class:`~rayfed.system.rounds.SyncRounds`): the
  clients whose work counts train (partial ones up to their steps by the deadline), and each round records its
  virtual time and each sampled client's fate;
* :class:`rayfed.scheduling.async_rounds.AsyncRounds`: asynchronous aggregation, a round per server step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayfed.config import RunConfig
from rayfed.engine.metrics import RoundRecord
from rayfed.execution.round_facts import RoundFacts
from rayfed.scheduling.system_records import ONLINE, VIRTUAL_TIME, status_counts, with_status
from rayfed.system.clock import Workload
from rayfed.system.profiles import DeviceProfiles
from rayfed.system.rounds import RoundOutcome, SyncRounds
from rayfed.system.status import ClientStatus
from rayfed.util.seeding import poisson_sample, sample_clients

if TYPE_CHECKING:
    from rayfed.scheduling.workload import ClientStates, RoundWork

logger = logging.getLogger(__name__)

__all__ = ["Rounds", "VirtualRounds"]


class Rounds:
    """Rounds without a system model: each samples ``engine.join_ratio`` of the clients (module docstring)."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    def context(
        self, round_index: int, message: Callable[[], Any] | None = None, states: ClientStates | None = None
    ) -> RoundFacts:
        """The round's facts, decided here once: its clients and learning rate. The initial model's evaluation
        (round -1) samples as round 0 and has round 0's learning rate. ``message`` (the round's message, fetched
        when called) and ``states`` (the store's client states) time the round of a method whose work changes by
        round."""
        config, t = self.config, max(round_index, 0)
        clients, ratio = config.data.num_clients, config.engine.join_ratio
        if config.engine.participation == "poisson":
            sampled = poisson_sample(config.seed, t, np.arange(clients, dtype=np.int64), ratio)
        else:
            sampled = sample_clients(config.seed, t, clients, ratio)
        return RoundFacts(round=round_index, seed=config.seed, lr=config.train.lr_at(t), sampled=sampled)

    def settle(self, round_index: int, record: RoundRecord, clients: pa.Table) -> pa.Table:
        """Add what the system model knows of the round to its record (``record.system``) and its per-client
        table (returned), and move on to the next round; nothing without a system model."""
        return clients

    def devices(self) -> DeviceProfiles | None:
        """The clients' devices, drawn once for the run (None without a system model)."""
        return None

    def state(self) -> dict[str, np.ndarray]:
        """What a checkpoint saves of the rounds run so far."""
        return {}

    def restore(self, state: Mapping[str, np.ndarray]) -> None:
        """Continue after the rounds whose :meth:`state` a checkpoint saved."""


class VirtualRounds(Rounds):
    """Synchronous rounds in virtual time (module docstring): each one begins when the previous one ended."""

    def __init__(self, config: RunConfig, rounds: SyncRounds, work: RoundWork | None = None) -> None:
        super().__init__(config)
        self.rounds = rounds
        self.work = work
        """Each round's own workload, for a method whose work changes by round (None: the run's, ``rounds.work``)."""
        self.now_s = 0.0
        """The run's virtual time: the end of the last round settled."""
        self._outcome: RoundOutcome | None = None
        self._warned = False
        """Whether the run warned of a client charged other than its work (:meth:`_check_charged`)."""

    def _outcome_of(
        self, round_index: int, message: Callable[[], Any] | None = None, states: ClientStates | None = None
    ) -> RoundOutcome:
        if self._outcome is None or self._outcome.round != round_index:
            work_of = None
            if self.work is not None:
                assert message is not None, "a method whose work changes by round is timed from its message"
                work, read, store = self.work, message, states or (lambda ids: {})

                def work_of(ids: np.ndarray) -> Workload:
                    return work.of(round_index, ids, read(), store)

            self._outcome = self.rounds.round(round_index, self.now_s, work_of)
        return self._outcome

    def context(
        self, round_index: int, message: Callable[[], Any] | None = None, states: ClientStates | None = None
    ) -> RoundFacts:
        """The clients whose work the round counts, timed with the round's own work where it changes by round
        (from ``message`` and ``states``); a partial one's step budget is the steps it did by the deadline of the
        phases a budget covers."""
        config, t = self.config, max(round_index, 0)
        outcome = self._outcome_of(t, message, states)
        counted = outcome.status <= ClientStatus.PARTIAL
        budget = None
        if (outcome.status == ClientStatus.PARTIAL).any():
            budget = outcome.budget[counted]
        return RoundFacts(
            round=round_index,
            seed=config.seed,
            lr=config.train.lr_at(t),
            sampled=outcome.client_ids[counted],
            step_budget=budget,
            planned=outcome.client_ids,
        )

    def settle(self, round_index: int, record: RoundRecord, clients: pa.Table) -> pa.Table:
        """The round's virtual time, status counts and clients online when it sampled; each sampled client's
        status, ``start_s`` (when the round began), ``finish_s`` (when its upload reached the server, null if it
        never did) and what the clock charged it (:meth:`charged`)."""
        if round_index < 0:
            record.system = {VIRTUAL_TIME: 0.0}
            return clients
        outcome = self._outcome_of(round_index)
        self.now_s = outcome.end_s
        record.system = {VIRTUAL_TIME: outcome.end_s, **status_counts(outcome.status), ONLINE: float(outcome.online)}
        finish = pa.array(outcome.finish_s, mask=~np.isfinite(outcome.finish_s))
        began = np.full(len(outcome.client_ids), outcome.start_s)
        columns = {"start_s": began, "finish_s": finish, **self.charged(outcome)}
        table = with_status(clients, round_index, outcome.client_ids, outcome.status, columns)
        self._check_charged(round_index, table)
        return table

    def devices(self) -> DeviceProfiles | None:
        return self.rounds.devices

    def charged(self, outcome: RoundOutcome) -> dict[str, np.ndarray]:
        """What the clock charged each sampled client in Eq. 1 (docs/system.md): ``charged_steps`` (all its phases'
        steps; a partial one's, those it took by the deadline), ``charged_bytes_down`` and ``charged_bytes_up``."""
        steps, down, up = (outcome.work or self.rounds.work).of(outcome.client_ids)
        partial = outcome.status == ClientStatus.PARTIAL
        return {
            "charged_steps": np.where(partial, outcome.steps, steps).astype(np.int64),
            "charged_bytes_down": down.astype(np.int64),
            "charged_bytes_up": up.astype(np.int64),
        }

    def _check_charged(self, round_index: int, table: pa.Table) -> None:
        """Warn, once a run, where a counted client trained or moved other than the clock charged it: a method
        whose work changes by round without declaring it (``VaryingWork``), whose virtual times are then off."""
        if self._warned or "trained_steps" not in table.column_names:
            return
        rows = table.filter(pc.is_in(table["status"], pa.array(["finished", "partial"])))
        for charged, done in (("steps", "trained_steps"), ("bytes_down", "bytes_down"), ("bytes_up", "bytes_up")):
            if pc.any(pc.not_equal(rows[f"charged_{charged}"], rows[done])).as_py():
                self._warned = True
                logger.warning(
                    "round %d: the virtual clock charged some clients other %s than they took (%s against %s): "
                    "algorithm.name=%r's work changes from round to round without declaring it, so its virtual "
                    "times are off; its client half should subclass rayfed.algorithms.declarations.VaryingWork "
                    "(docs/system.md, 'The virtual clock')",
                    round_index,
                    charged.replace("_", " "),
                    f"charged_{charged}",
                    done,
                    self.config.algorithm.name,
                )
                return

    def state(self) -> dict[str, np.ndarray]:
        return {"now_s": np.array([self.now_s])}

    def restore(self, state: Mapping[str, np.ndarray]) -> None:
        self.now_s = float(state["now_s"][0])
        self._outcome = None
