"""Synchronous rounds in virtual time: whom a round samples, when each one finishes, and whose work counts.

A round that begins at virtual time ``t0`` (the end of the previous round):

1. waits, if no client is online, until one comes online; samples among the clients online then (FLGo's
   availability, FedScale's feasible clients): ``n`` = ⌊join_ratio·M⌋ of them, or ⌊n · over_commit⌋ with
   over-commitment, from the run's sampling stream, so that with every client online and no over-commitment it
   samples the clients a run without a system model samples;
2. gives each sampled client i its finish time ``t0 + T_i`` (Eq. 1 of :mod:`rayfed.system.clock`); a client
   loses its work if it drops out (``system.dropout``, FLGo's connectivity) or goes offline before it finishes
   (FedScale's check that a client is still active when it reports);
3. keeps the first ``n`` that finish by the deadline ``t0 + D`` (FedScale's over-commitment keeps the first
   finishers; ties go to the smaller client id); the others that finish in time are surplus, those after the
   deadline late. With ``system.late_work="partial"`` a round that reaches the deadline without ``n`` finished
   clients also counts the late ones' partial work (Eq. 2), first finishers first, up to ``n`` clients: those that
   take at least one step of the phases a step budget covers (what the server receives); the others stay late;
4. ends when its ``n``-th client finished, or else at the deadline, or else (no deadline) when the last
   client it kept finished; a round in which no client reports and no deadline is set ends when the slowest
   sampled client would have finished.

:class:`SyncRounds` is what the round loop asks each round; :func:`settle_round` is steps 2-4 as a pure
function of arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from rayfed.system.clock import ClientTimes, Workload, client_times, steps_within
from rayfed.system.profiles import DeviceProfiles
from rayfed.system.settings import SystemConfig
from rayfed.system.status import ClientStatus, counted
from rayfed.util.errors import ConfigError
from rayfed.util.seeding import participants, sample_among

__all__ = ["RoundOutcome", "SyncRounds", "settle_round", "round_sizes"]

_DROPOUT = 21
"""The run seed's stream of the clients that drop out of a round (apart from sampling and batches)."""


@dataclass(frozen=True)
class RoundOutcome:
    """One synchronous round in virtual time: when it began and ended, and what became of each sampled client."""

    round: int
    start_s: float
    """When the round began: the previous round's end, or later if it waited for a client to come online."""
    end_s: float
    """When the server closed the round: the run's virtual time after it (rounds.parquet ``virtual_time_s``)."""
    client_ids: np.ndarray
    """int64: the sampled clients, sorted."""
    finish_s: np.ndarray
    """float64: when each one's upload reached the server (``inf``: it never did)."""
    status: np.ndarray
    """int8 :class:`~rayfed.system.status.ClientStatus` of each one."""
    steps: np.ndarray
    """int64: the local steps of each one that count (all its steps, or its partial ones; 0 for the others)."""
    budget: np.ndarray
    """int64: a partial client's step budget, the steps it takes of the phases a budget covers (Eq. 2's k_i(D));
    -1 for the others."""
    online: int = 0
    """How many clients were online when the round sampled (all of them without an availability model)."""
    work: Workload | None = None
    """The workload the round was timed with (what the clock charged each client: Eq. 1's steps and bytes)."""

    @property
    def counted_ids(self) -> np.ndarray:
        """The clients whose work the round aggregates: the ones to train."""
        return self.client_ids[counted(self.status)]

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def settle_round(
    round_index: int,
    start_s: float,
    client_ids: np.ndarray,
    times: ClientTimes,
    steps: np.ndarray,
    seconds_per_step: np.ndarray,
    lost: np.ndarray,
    online_until: np.ndarray,
    wanted: int,
    config: SystemConfig,
    budgeted: np.ndarray | None = None,
) -> RoundOutcome:
    """Steps 2-4 of the module docstring for the sampled ``client_ids`` (their times, their planned ``steps``,
    each one's seconds per step, whether it drops out, and when it goes offline), keeping at most ``wanted``;
    ``budgeted``: the steps of each one's phases that a step budget covers (None: all its steps)."""
    total = times.total_s
    status = np.full(len(client_ids), ClientStatus.FINISHED, dtype=np.int8)
    status[start_s + total > online_until] = ClientStatus.OFFLINE
    status[lost] = ClientStatus.DROPPED
    reporting = status == ClientStatus.FINISHED
    finish = np.where(reporting, start_s + total, np.inf)  # a lost client's work never reaches the server
    deadline = np.inf if config.deadline_s is None else start_s + config.deadline_s
    order = np.lexsort((client_ids, finish))  # first finishers first, ties to the smaller id
    in_time = order[reporting[order] & (finish[order] <= deadline)]
    status[order[reporting[order] & (finish[order] > deadline)]] = ClientStatus.LATE
    status[in_time[wanted:]] = ClientStatus.SURPLUS
    kept = in_time[:wanted]
    done = np.where(status == ClientStatus.FINISHED, steps, 0).astype(np.int64)
    budget = np.full(len(client_ids), -1, dtype=np.int64)
    if len(kept) == wanted:
        end = float(finish[kept[-1]])
    elif config.deadline_s is not None:
        end = float(deadline)
        if config.late_work == "partial":
            late = order[status[order] == ClientStatus.LATE]
            covered = steps[late] if budgeted is None else budgeted[late]
            fixed = None if budgeted is None else steps[late] - covered
            partial = steps_within(_rows(times, late), covered, config.deadline_s, seconds_per_step[late], fixed=fixed)
            chosen = late[partial > 0][: wanted - len(kept)]
            status[chosen] = ClientStatus.PARTIAL
            budget[chosen] = partial[partial > 0][: wanted - len(kept)]
            done[chosen] = budget[chosen] + (0 if fixed is None else fixed[partial > 0][: wanted - len(kept)])
            finish[chosen] = deadline
    elif len(kept):
        end = float(finish[kept[-1]])
    else:
        end = float(start_s + total.max(initial=0.0))
    return RoundOutcome(round_index, float(start_s), end, client_ids, finish, status, done, budget)


def round_sizes(num_clients: int, join_ratio: float, over_commit: float) -> tuple[int, int]:
    """(n, drawn): the clients a round keeps, ⌊join_ratio·M⌋, and those it samples, ⌊n · over_commit⌋ (step 1 of
    the module docstring); ConfigError for more than the run has."""
    wanted = participants(num_clients, join_ratio)
    drawn = wanted * over_commit + 1e-9
    if drawn >= num_clients + 1:
        raise ConfigError(
            f"system.over_commit={over_commit:g} would sample {wanted} × {over_commit:g} clients a round, "
            f"more than the run's {num_clients}: set system.over_commit to at most "
            f"{num_clients / wanted:g} (every client), or lower engine.join_ratio"
        )
    return wanted, max(wanted, int(drawn))


def _rows(times: ClientTimes, rows: np.ndarray) -> ClientTimes:
    return ClientTimes(times.download_s[rows], times.train_s[rows], times.upload_s[rows])


class SyncRounds:
    """The system model of a synchronous run: each round, whom it samples and whose work counts (module
    docstring). Built once per run from its devices, its workload and its seeds; :meth:`round` is a function of
    the round and the virtual time it begins at, so a resumed run repeats it."""

    def __init__(
        self, config: SystemConfig, devices: DeviceProfiles, work: Workload, seed: int, join_ratio: float
    ) -> None:
        self.config, self.devices, self.work, self.seed = config, devices, work, seed
        self.num_clients = devices.num_clients
        self.wanted, self.drawn = round_sizes(self.num_clients, join_ratio, config.over_commit)
        self._all = np.arange(self.num_clients, dtype=np.int64)
        self._check_deadline()

    def _check_deadline(self) -> None:
        """Refuse a deadline that no device meets: no round could ever count a client."""
        if self.config.deadline_s is None:
            return
        times = client_times(self.devices, self.work, self._all, step_s=self.config.step_s)
        needed = times.total_s
        if self.config.late_work == "partial":  # the steps no budget covers and one that it does are work to count
            per_step = self._seconds_per_step(self._all)
            fixed = (self.work.steps - self.work.budgeted_of(self._all)) * per_step
            needed = times.download_s + times.upload_s + np.minimum(times.train_s, fixed + per_step)
        fastest = int(np.argmin(needed))
        if needed[fastest] > self.config.deadline_s:
            raise ConfigError(
                f"system.deadline_s={self.config.deadline_s:g} is shorter than any device's round: the fastest, "
                f"client {fastest}'s, takes {needed[fastest]:.4g} s (download {times.download_s[fastest]:.4g} s, "
                f"training {times.train_s[fastest]:.4g} s, upload {times.upload_s[fastest]:.4g} s); raise "
                "system.deadline_s, or lower the work (train.local_epochs) or system.step_s"
            )

    def _seconds_per_step(self, ids: np.ndarray) -> np.ndarray:
        return self.devices.slowdown[ids] * self.config.step_s

    def _online(self, now_s: float) -> tuple[float, np.ndarray]:
        """When a round asked to begin at ``now_s`` begins (then, or when the first client comes online), and the
        clients online then."""
        availability = self.devices.availability
        if availability.always:
            return float(now_s), self._all
        online = availability.online(self._all, now_s)
        if not online.any():
            now_s = float(availability.next_online(self._all, now_s).min())
            online = availability.online(self._all, now_s)
        return float(now_s), self._all[online]

    def round(
        self, round_index: int, now_s: float, work_of: Callable[[np.ndarray], Workload] | None = None
    ) -> RoundOutcome:
        """Round ``round_index``, asked to begin at virtual time ``now_s``: whom it samples, when each one
        finishes, whose work counts and when it ends; ``work_of``: the round's own workload of the clients it
        samples, for a method whose work changes by round (None: the run's, ``work``)."""
        start, online = self._online(now_s)
        ids = sample_among(self.seed, round_index, online, self.drawn)
        work = self.work if work_of is None else work_of(ids)
        times = client_times(self.devices, work, ids, step_s=self.config.step_s)
        lost = np.zeros(len(ids), dtype=bool)
        if self.config.dropout > 0:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, _DROPOUT, round_index]))
            lost = rng.random(len(ids)) < self.config.dropout
        until = self.devices.availability.online_until(ids, start)
        outcome = settle_round(
            round_index,
            start,
            ids,
            times,
            work.steps[ids],
            self._seconds_per_step(ids),
            lost,
            until,
            self.wanted,
            self.config,
            None if work.budgeted is None else work.budgeted[ids],
        )
        return replace(outcome, online=len(online), work=work)
