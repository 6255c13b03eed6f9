"""When each client is online: windows of time that repeat with a period, for all clients as flat arrays.

Client i is online at virtual time t when ``t mod periods[i]`` falls in one of its windows
``[starts[j], ends[j])``, ``j`` in ``offsets[i]:offsets[i + 1]`` (the CSR form of :mod:`rayfed.data.csr`): a
day for the diurnal preset, a trace's ``finish_time`` for FedScale's behaviour traces. The windows of a client
are sorted and disjoint (touching ones are merged), so a query is one binary search per client, vectorised
over all the clients asked about: 100,000 clients' windows are a few arrays, and asking which of them are
online is a few milliseconds.

>>> days = Availability.from_windows(np.array([0, 0, 1]), np.array([0.0, 20.0, 5.0]), np.array([8.0, 24.0, 10.0]),
...                                  np.array([24.0, 24.0]), 2, "example")
>>> days.online(np.array([0, 1]), 6.0).tolist(), days.online(np.array([0, 1]), 30.0 + 24).tolist()
([True, True], [True, True])
>>> days.online_until(np.array([0, 1]), 22.0).tolist()  # client 0's night window runs on into the morning
[32.0, -inf]
>>> days.next_online(np.array([0, 1]), 12.0).tolist()
[20.0, 29.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.system.checks import first_not_positive
from rayfed.util.errors import ConfigError

__all__ = ["Availability", "diurnal"]

DAY_S = 86400.0
"""Seconds in a day: the period of the diurnal preset."""


@dataclass(frozen=True)
class Availability:
    """Every client's online windows within its period (module docstring); ``always``: every client is online at
    every moment (no windows are kept)."""

    offsets: np.ndarray
    """int64 (M + 1,): client i's windows are ``offsets[i]:offsets[i + 1]``."""
    starts: np.ndarray
    """float64: each window's start, seconds into its client's period, sorted within a client."""
    ends: np.ndarray
    """float64: each window's end (exclusive), after its start, at most the period."""
    periods: np.ndarray
    """float64 (M,): the length after which each client's windows repeat."""
    always: bool = False

    @classmethod
    def everyone(cls, num_clients: int) -> Availability:
        """Every client online at every moment."""
        none = np.zeros(0)
        return cls(np.zeros(num_clients + 1, dtype=np.int64), none, none, np.full(num_clients, np.inf), always=True)

    @classmethod
    def from_windows(
        cls,
        clients: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        periods: np.ndarray,
        num_clients: int,
        source: str,
    ) -> Availability:
        """Windows ``[starts[k], ends[k])`` of client ``clients[k]`` (any order; empty ones dropped, overlapping or
        touching ones merged) repeating with ``periods[client]``; ConfigError naming ``source`` for a period that
        is not positive, a window outside its period, or no window at all (no client would ever be online)."""
        clients = np.asarray(clients, dtype=np.int64)
        starts, ends = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
        periods = np.asarray(periods, dtype=np.float64)
        first = first_not_positive(periods)
        if first is not None:
            raise ConfigError(
                f"{source}: client {first}'s period is {float(periods[first])!r}; it must be a number > 0"
            )
        outside = ~((starts >= 0) & (ends >= starts) & (ends <= periods[clients]))
        if outside.any():
            k = int(np.flatnonzero(outside)[0])
            start, end, period = float(starts[k]), float(ends[k]), float(periods[clients[k]])
            raise ConfigError(
                f"{source}: client {int(clients[k])}'s online window [{start!r}, {end!r}) is not within its period "
                f"[0, {period!r}]; a window starts at or after 0 and ends after its start"
            )
        keep = ends > starts
        if not keep.any():
            raise ConfigError(f"{source}: no client is ever online (every window is empty); give some an online time")
        order = np.lexsort((starts[keep], clients[keep]))
        clients, starts, ends = _merged(clients[keep][order], starts[keep][order], ends[keep][order])
        offsets = np.zeros(num_clients + 1, dtype=np.int64)
        np.cumsum(np.bincount(clients, minlength=num_clients), out=offsets[1:])
        return cls(offsets, starts, ends, periods)

    @property
    def num_clients(self) -> int:
        return len(self.periods)

    @property
    def nbytes(self) -> int:
        """Bytes the arrays hold."""
        return self.offsets.nbytes + self.starts.nbytes + self.ends.nbytes + self.periods.nbytes

    def _locate(self, ids: np.ndarray, t: np.ndarray | float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each client in ``ids`` at time ``t``: ``x``, the time into its period; ``j``, its last window that
        starts at or before ``x`` (``offsets[i] - 1`` if none); and whether it is online (``x`` in window ``j``)."""
        x = np.mod(t, self.periods[ids])
        first, stop = self.offsets[ids], self.offsets[ids + 1]
        j = _last_at_or_before(self.starts, first, stop, x)
        online = (j >= first) & (x < self.ends[np.maximum(j, 0)])
        return x, j, online

    def online(self, ids: np.ndarray, t: np.ndarray | float) -> np.ndarray:
        """Whether each client of ``ids`` is online at time ``t`` (a number, or one per client)."""
        if self.always:
            return np.ones(len(ids), dtype=bool)
        return self._locate(np.asarray(ids, dtype=np.int64), t)[2]

    def online_until(self, ids: np.ndarray, t: np.ndarray | float) -> np.ndarray:
        """When each client's stretch online that holds time ``t`` ends (``inf``: it never ends; ``-inf``: the
        client is offline at ``t``). A window that ends with the period runs on into one that starts with it."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.always:
            return np.full(len(ids), np.inf)
        x, j, online = self._locate(ids, t)
        j = np.maximum(j, 0)
        first = np.minimum(self.offsets[ids], len(self.starts) - 1)
        end, period = self.ends[j], self.periods[ids]
        wraps = (end == period) & (self.starts[first] == 0.0)  # the stretch goes on into the next period
        until = t - x + end + np.where(wraps, self.ends[first], 0.0)
        until = np.where(wraps & (j == first), np.inf, until)  # one window covering the whole period
        return np.where(online, until, -np.inf)

    def next_online(self, ids: np.ndarray, t: np.ndarray | float) -> np.ndarray:
        """The earliest time at or after ``t`` each client of ``ids`` is online (``inf`` for a client that never
        is)."""
        ids = np.asarray(ids, dtype=np.int64)
        now = np.broadcast_to(np.asarray(t, dtype=np.float64), (len(ids),))
        if self.always:
            return now.copy()
        x, j, online = self._locate(ids, t)
        first, stop = self.offsets[ids], self.offsets[ids + 1]
        following = j + 1  # the next window in this period, or else the first of the next period
        later = following < stop
        start = self.starts[np.minimum(np.where(later, following, first), len(self.starts) - 1)]
        upcoming = now - x + np.where(later, 0.0, self.periods[ids]) + start
        return np.where(online, now, np.where(first == stop, np.inf, upcoming))


def _last_at_or_before(starts: np.ndarray, first: np.ndarray, stop: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For each query, the last index in ``[first, stop)`` whose start is at or before ``x`` (``first - 1`` if
    none): a binary search vectorised over the queries, each in its own sorted segment of ``starts``."""
    low, high = first.copy(), stop.copy()  # invariant: starts[first:low] <= x < starts[high:stop]
    last = len(starts) - 1
    while (active := low < high).any():
        middle = (low + high) // 2
        below = active & (starts[np.minimum(middle, last)] <= x)
        low = np.where(below, middle + 1, low)
        high = np.where(active & ~below, middle, high)
    return low - 1


def _merged(clients: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Windows sorted by (client, start), each client's overlapping or touching windows merged into one: each pass
    joins a window to the one before it when it starts by that one's end, until no pass joins any."""
    while len(starts) > 1:
        joins = (clients[1:] == clients[:-1]) & (starts[1:] <= ends[:-1])
        if not joins.any():
            break
        begins = np.flatnonzero(np.concatenate([[True], ~joins]))
        clients, starts, ends = clients[begins], starts[begins], np.maximum.reduceat(ends, begins)
    return clients, starts, ends


def diurnal(
    num_clients: int, online_hours: float, start_h: float, spread_h: float, rng: np.random.Generator
) -> Availability:
    """Each client online ``online_hours`` a day from an hour drawn from N(``start_h``, ``spread_h``²) (mod 24):
    devices that join when idle and charging, mostly at night, so that the number online swings over the day
    (FedScale's and FLASH's traces show that swing). The virtual clock's 0 is the start of day 0."""
    if online_hours >= 24:
        return Availability.everyone(num_clients)
    length = online_hours * 3600.0
    begin = np.mod((start_h + spread_h * rng.standard_normal(num_clients)) * 3600.0, DAY_S)
    end = begin + length
    wraps = end > DAY_S
    clients = np.concatenate([np.arange(num_clients), np.flatnonzero(wraps)])
    starts = np.concatenate([begin, np.zeros(int(wraps.sum()))])
    ends = np.concatenate([np.minimum(end, DAY_S), end[wraps] - DAY_S])
    return Availability.from_windows(clients, starts, ends, np.full(num_clients, DAY_S), num_clients, "diurnal")
