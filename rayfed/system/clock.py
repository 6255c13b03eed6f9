"""The virtual clock: how long a client's round takes on its device, as pure functions of arrays.

A client i that is sent ``b_down`` bytes, trains ``s_i`` local steps (every epoch of every phase its method gives
it) and sends back ``b_up`` bytes (its method's own messages) is busy for

    T_i = b_down / β_down,i + s_i · c_i · τ + b_up / β_up,i                                      (1)

seconds of virtual time: its download, its local training (``c_i``, its slowdown, times ``τ``, the reference
device's seconds per step, ``system.step_s``) and its upload (docs/system.md). Stopped at a deadline ``D`` after
its round began, it trains the ``s_i − p_i`` steps of the phases a step budget does not cover whole, and

    k_i(D) = min(p_i, ⌊(D − b_down / β_down,i − b_up / β_up,i − (s_i − p_i) · c_i · τ) / (c_i · τ)⌋)   (2)

of the ``p_i`` steps of those it covers (``Phase.budgeted``: by default the phase whose result is uploaded), and
still uploads them in time (its partial work, when ``system.late_work="partial"``).

>>> from rayfed.system.availability import Availability
>>> from rayfed.system.profiles import DeviceProfiles
>>> devices = DeviceProfiles(np.array([1.0, 4.0]), np.array([1e6, 1e6]), np.array([5e5, 5e5]), Availability.everyone(2))
>>> work = Workload(np.array([10, 10]), 2e6, 1e6)
>>> times = client_times(devices, work, np.array([0, 1]), step_s=0.5)
>>> times.download_s.tolist(), times.train_s.tolist(), times.upload_s.tolist(), times.total_s.tolist()
([2.0, 2.0], [5.0, 20.0], [2.0, 2.0], [9.0, 24.0])
>>> steps_within(times, work.steps[[0, 1]], 12.0, devices.slowdown[[0, 1]] * 0.5).tolist()
[10, 4]
>>> steps_within(times, np.array([5, 5]), 12.0, devices.slowdown[[0, 1]] * 0.5, fixed=np.array([5, 5])).tolist()
[5, 0]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.system.profiles import DeviceProfiles

__all__ = ["Workload", "ClientTimes", "client_times", "steps_within"]


@dataclass(frozen=True)
class Workload:
    """What each client does in a round, whoever samples it: its local steps and the bytes it moves."""

    steps: np.ndarray
    """int64 (M,): the local steps a client takes in a round (every epoch of every phase: their mini-batches)."""
    bytes_down: np.ndarray | float
    """The bytes of the message a client downloads: one number for all, or one per client."""
    bytes_up: np.ndarray | float
    """The bytes a client uploads: one number for all, or one per client."""
    budgeted: np.ndarray | None = None
    """int64 (M,): the steps of the phases a deadline's step budget covers (Eq. 2's ``p_i``); None: all of them."""

    def __post_init__(self) -> None:
        steps = np.asarray(self.steps)
        if steps.ndim != 1 or (steps < 0).any():
            raise ValueError("Workload.steps holds one count >= 0 per client")
        budgeted = steps if self.budgeted is None else np.asarray(self.budgeted)
        if budgeted.shape != steps.shape or (budgeted < 0).any() or (budgeted > steps).any():
            raise ValueError("Workload.budgeted holds one count per client, from 0 to its steps")
        for name in ("bytes_down", "bytes_up"):
            values = np.asarray(getattr(self, name), dtype=np.float64)
            if values.ndim > 1 or (values.ndim == 1 and len(values) != len(steps)) or (values < 0).any():
                raise ValueError(f"Workload.{name} is one byte count >= 0, or one per client")

    def of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(steps, bytes down, bytes up) of the clients ``ids``."""
        return self.steps[ids], _per_client(self.bytes_down, ids), _per_client(self.bytes_up, ids)

    def budgeted_of(self, ids: np.ndarray) -> np.ndarray:
        """Eq. 2's ``p_i`` of the clients ``ids``: the steps a deadline's budget covers."""
        return self.steps[ids] if self.budgeted is None else np.asarray(self.budgeted)[ids]


def _per_client(value: np.ndarray | float, ids: np.ndarray) -> np.ndarray:
    values = np.asarray(value, dtype=np.float64)
    return values[ids] if values.ndim else np.full(len(ids), float(values))


@dataclass(frozen=True)
class ClientTimes:
    """Eq. (1)'s three terms for some clients, in seconds of virtual time."""

    download_s: np.ndarray
    train_s: np.ndarray
    upload_s: np.ndarray

    @property
    def total_s(self) -> np.ndarray:
        """T_i, Eq. (1)."""
        return self.download_s + self.train_s + self.upload_s


def client_times(devices: DeviceProfiles, work: Workload, ids: np.ndarray, *, step_s: float) -> ClientTimes:
    """Eq. (1) for the clients ``ids``: each one's download, local training and upload time on its device."""
    steps, down, up = work.of(ids)
    return ClientTimes(
        download_s=down / devices.download_bps[ids],
        train_s=steps * (devices.slowdown[ids] * step_s),
        upload_s=up / devices.upload_bps[ids],
    )


def steps_within(
    times: ClientTimes,
    steps: np.ndarray,
    budget_s: float,
    seconds_per_step: np.ndarray,
    *,
    fixed: np.ndarray | None = None,
) -> np.ndarray:
    """Eq. (2): the steps each client finishes, of the ``steps`` a budget covers, when it must have uploaded within
    ``budget_s`` seconds of starting its round after training its ``fixed`` steps, those no budget covers, whole
    (0 when even its download, its fixed steps and its upload do not fit)."""
    room = budget_s - times.download_s - times.upload_s
    if fixed is not None:
        room = room - fixed * seconds_per_step
    done = np.floor(np.maximum(room, 0.0) / seconds_per_step)
    return np.minimum(steps, done).astype(np.int64)
