"""What the virtual clock cannot simulate, refused before a run starts: a client's round (Eq. 1 of
:mod:`rayfed.system.clock`) too long for float64 over the run, and an asynchronous schedule in which no client ever
stays online long enough to report (its server would wait for K arrivals forever).

>>> from rayfed.system.availability import Availability
>>> online = Availability.from_windows(np.arange(2), np.zeros(2), np.array([5.0, 20.0]), np.full(2, 100.0), 2, "t")
>>> longest_online(online).tolist()
[5.0, 20.0]
"""

from __future__ import annotations

import numpy as np

from rayfed.system.availability import Availability
from rayfed.system.clock import Workload, client_times
from rayfed.system.profiles import DeviceProfiles
from rayfed.system.settings import SystemConfig
from rayfed.util.errors import ConfigError

__all__ = ["check_clock", "check_reports", "longest_online"]


def check_clock(config: SystemConfig, devices: DeviceProfiles, work: Workload, rounds: int) -> None:
    """ConfigError naming the field unless every client's round, and that many rounds of every client one after
    another, are a finite number of virtual seconds (``system.step_s`` = 1e308, or a bandwidth of 1e-320 bytes/s,
    would make them infinite)."""
    ids = np.arange(devices.num_clients)
    with np.errstate(over="ignore", divide="ignore"):
        times = client_times(devices, work, ids, step_s=config.step_s)
        spans = times.total_s * float(max(rounds, 1)) * float(devices.num_clients)
    bad = np.flatnonzero(~np.isfinite(spans))
    if not len(bad):
        return
    client = int(bad[0])
    parts = {"download": times.download_s[client], "training": times.train_s[client], "upload": times.upload_s[client]}
    part = max(parts, key=lambda name: float(parts[name]))
    if part == "training":
        cause = f"system.step_s={config.step_s:g} at its slowdown {devices.slowdown[client]:g}"
        fix = "lower system.step_s"
    else:
        bandwidth = (devices.download_bps if part == "download" else devices.upload_bps)[client]
        source = (
            f"system.device_trace={config.device_trace!r}"
            if config.devices == "trace"
            else f"system.{part}_mbps={getattr(config, f'{part}_mbps'):g}"
        )
        cause = f"its {part} bandwidth of {bandwidth:g} bytes/s ({source})"
        fix = f"raise its bandwidth in {source.split('=')[0]}"
    raise ConfigError(
        f"client {client}'s round takes {float(times.total_s[client]):.4g} s of virtual time, its {part} "
        f"{float(parts[part]):.4g} s from {cause}: the virtual clock cannot count {rounds} rounds of it; {fix}"
    )


def longest_online(availability: Availability) -> np.ndarray:
    """Each client's longest stretch online, in seconds (``inf``: online all the time; 0: never online)."""
    if availability.always:
        return np.full(availability.num_clients, np.inf)
    owners = np.repeat(np.arange(availability.num_clients), np.diff(availability.offsets))
    stretch = availability.online_until(owners, availability.starts) - availability.starts
    longest = np.zeros(availability.num_clients)
    np.maximum.at(longest, owners, stretch)
    return longest


def check_reports(config: SystemConfig, devices: DeviceProfiles, round_s: np.ndarray) -> None:
    """ConfigError unless some client's longest stretch online holds its whole round (``round_s``, Eq. 1): else
    every client launched goes offline before it reports, and an asynchronous server never makes a step."""
    longest = longest_online(devices.availability)
    if (longest >= round_s).any():
        return
    client = int(np.argmax(longest / round_s))
    source = (
        f"system.availability_trace={config.availability_trace!r}"
        if config.availability == "trace"
        else f"system.availability={config.availability!r}"
    )
    raise ConfigError(
        f"an asynchronous server (FedBuff, FedAsync) could never make a step here: no client stays online long "
        f"enough to report ({source}); the closest, "
        f"client {client}, is online at most {float(longest[client]):.4g} s at a time, but its round takes "
        f"{float(round_s[client]):.4g} s; give the clients longer online windows, or lower the work "
        "(train.local_epochs) or system.step_s"
    )
