"""Online windows: the vectorised queries agree with a plain reading of the windows, and the diurnal preset swings
over the day."""

from __future__ import annotations

import numpy as np
import pytest

from rayfed.system.availability import DAY_S, Availability, diurnal
from rayfed.util.errors import ConfigError


def _random_windows(rng: np.random.Generator, num_clients: int) -> tuple[np.ndarray, ...]:
    """Up to 4 windows per client (some overlapping, some touching, some clients with none), periods 10-100."""
    periods = rng.integers(10, 100, num_clients).astype(float)
    clients, starts, ends = [], [], []
    for client in range(num_clients):
        for _ in range(rng.integers(0, 5)):
            start = float(rng.integers(0, int(periods[client])))
            end = float(min(periods[client], start + rng.integers(1, 30)))
            clients.append(client)
            starts.append(start)
            ends.append(end)
    return np.array(clients, dtype=np.int64), np.array(starts), np.array(ends), periods


def _reference(clients, starts, ends, periods, client: int, t: float) -> tuple[bool, float, float]:
    """Online, online-until and next-online by stepping through time one unit at a time (integer windows)."""

    def on(time: float) -> bool:
        x = time % periods[client]
        return any(s <= x < e for c, s, e in zip(clients, starts, ends, strict=True) if c == client)

    horizon = t + 3 * periods[client]
    until, probe = -np.inf, t
    if on(t):
        while on(probe) and probe < horizon:
            probe += 1.0
        until = np.inf if probe >= horizon else probe
    upcoming, probe = np.inf, t
    while probe < horizon:
        if on(probe):
            upcoming = probe
            break
        probe = np.floor(probe) + 1.0
    return on(t), until, upcoming


def test_queries_agree_with_a_plain_reading_of_the_windows() -> None:
    rng = np.random.default_rng(5)
    clients, starts, ends, periods = _random_windows(rng, 40)
    availability = Availability.from_windows(clients, starts, ends, periods, 40, "test")
    ids = np.arange(40)
    for t in (0.0, 3.0, 17.0, 99.0, 250.0):
        online, until, upcoming = (
            availability.online(ids, t),
            availability.online_until(ids, t),
            availability.next_online(ids, t),
        )
        for client in range(40):
            expected = _reference(clients, starts, ends, periods, client, t)
            assert (online[client], until[client], upcoming[client]) == expected, (client, t)


def test_touching_and_overlapping_windows_are_merged() -> None:
    availability = Availability.from_windows(
        np.array([0, 0, 0, 0, 1]),
        np.array([5.0, 0.0, 2.0, 10.0, 3.0]),
        np.array([12.0, 10.0, 3.0, 11.0, 3.0]),
        np.array([20.0, 20.0]),
        2,
        "test",
    )
    assert availability.offsets.tolist() == [0, 1, 1]  # client 1's only window is empty
    assert (availability.starts.tolist(), availability.ends.tolist()) == ([0.0], [12.0])
    assert availability.next_online(np.array([1]), 0.0).tolist() == [np.inf]


def test_a_stretch_online_runs_on_across_the_period() -> None:
    days = Availability.from_windows(
        np.array([0, 0, 1]), np.array([0.0, 18.0, 0.0]), np.array([6.0, 24.0, 24.0]), np.array([24.0, 24.0]), 2, "t"
    )
    assert days.online_until(np.array([0, 1]), 20.0).tolist() == [30.0, np.inf]
    assert days.online_until(np.array([0]), 24.0 * 3 + 1).tolist() == [24.0 * 3 + 6]


def test_everyone_is_always_online() -> None:
    everyone = Availability.everyone(3)
    assert everyone.online(np.arange(3), 123.0).all()
    assert everyone.online_until(np.arange(3), 5.0).tolist() == [np.inf] * 3
    assert everyone.next_online(np.arange(3), 5.0).tolist() == [5.0] * 3


def test_the_diurnal_preset_swings_between_night_and_day() -> None:
    hours = diurnal(10_000, 8.0, 22.0, 3.0, np.random.default_rng(0))
    ids = np.arange(10_000)
    online = [hours.online(ids, hour * 3600.0).mean() for hour in range(24)]
    assert abs(np.mean(online) - 8 / 24) < 0.01  # each client is online 8 hours of 24
    assert online[2] > 0.7 and online[14] < 0.05  # most at night, almost none in the afternoon
    assert online == [hours.online(ids, DAY_S * 5 + hour * 3600.0).mean() for hour in range(24)]  # every day alike
    whole_day = diurnal(100, 24.0, 22.0, 3.0, np.random.default_rng(0))
    assert whole_day.online_until(np.arange(100), 1234.0).tolist() == [np.inf] * 100


@pytest.mark.parametrize(
    ("windows", "message"),
    [
        (([0], [2.0], [30.0], [24.0]), r"test: client 0's online window \[2.0, 30.0\) is not within its period"),
        (([0], [5.0], [2.0], [24.0]), r"test: client 0's online window \[5.0, 2.0\) is not within its period"),
        (([0], [0.0], [1.0], [0.0]), r"test: client 0's period is 0.0; it must be a number > 0"),
        (([0], [3.0], [3.0], [24.0]), r"test: no client is ever online"),
    ],
)
def test_bad_windows_are_refused(windows, message) -> None:
    clients, starts, ends, periods = (np.array(part) for part in windows)
    with pytest.raises(ConfigError, match=message):
        Availability.from_windows(clients, starts, ends, periods, 1, "test")
