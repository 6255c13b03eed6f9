"""Every client's device: how slow it computes, how fast it downloads and uploads, and when it is online.

One array per quantity over all M clients, never an object per client: 100,000 clients' profiles with a
diurnal window each take a few megabytes (:attr:`DeviceProfiles.nbytes`) and are drawn or read in a fraction of
a second. :func:`load_profiles` makes them from the ``system`` section: drawn from ``system.seed`` (the same
devices for every training seed, as ``data.seed`` keeps the same partition) or read from trace files.

>>> from rayfed.system.settings import SystemConfig
>>> devices = load_profiles(SystemConfig(devices="lognormal", availability="diurnal"), 1000)
>>> devices.num_clients, bool(np.median(devices.slowdown) < 1.1), devices.nbytes < 100_000
(1000, True, True)
>>> load_profiles(SystemConfig(), 1000) is None  # system.devices="off": no system model
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.system.availability import Availability, diurnal
from rayfed.system.checks import first_not_positive
from rayfed.system.models import AVAILABILITY, DEVICES, model_availability, model_devices
from rayfed.system.settings import SystemConfig
from rayfed.system.traces import (
    DeviceColumns,
    fedscale_availability,
    fedscale_devices,
    is_table,
    table_availability,
    table_devices,
)
from rayfed.util.errors import ConfigError

__all__ = ["DeviceProfiles", "load_profiles", "BYTES_PER_MBIT"]

BYTES_PER_MBIT = 1e6 / 8
_DEVICES, _ONLINE = 1, 2
"""Streams of ``system.seed``: the devices' speeds and bandwidths, and their online hours."""


@dataclass(frozen=True)
class DeviceProfiles:
    """The clients' devices, one entry per client in each array."""

    slowdown: np.ndarray
    """float64 (M,): a device's time per local step over the reference device's (1 = the reference, 2 = half as
    fast); its step takes ``slowdown × system.step_s`` seconds."""
    download_bps: np.ndarray
    """float64 (M,): download bandwidth, bytes per second."""
    upload_bps: np.ndarray
    """float64 (M,): upload bandwidth, bytes per second."""
    availability: Availability

    def __post_init__(self) -> None:
        count = len(self.slowdown)
        for name in ("slowdown", "download_bps", "upload_bps"):
            values = getattr(self, name)
            if values.shape != (count,):
                raise ValueError(
                    f"DeviceProfiles.{name} has shape {values.shape}; every array has one entry per client"
                )
            client = first_not_positive(values)
            if client is not None:
                raise ConfigError(
                    f"client {client}'s device has {name}={float(values[client])!r}; speeds and bandwidths must be "
                    "finite numbers > 0"
                )
        if self.availability.num_clients != count:
            raise ValueError(
                f"the availability covers {self.availability.num_clients} clients, the devices {count}: one each"
            )

    @property
    def num_clients(self) -> int:
        return len(self.slowdown)

    @property
    def nbytes(self) -> int:
        """Bytes the profiles hold."""
        return self.slowdown.nbytes + self.download_bps.nbytes + self.upload_bps.nbytes + self.availability.nbytes


def load_profiles(config: SystemConfig, num_clients: int) -> DeviceProfiles | None:
    """The devices of a run of ``num_clients`` clients as ``config`` describes them; None when it models none
    (``system.devices="off"``). Trace files are read here: ConfigError naming the field for a bad one."""
    if not config.enabled:
        return None
    slowdown, down, up = _devices(config, num_clients)
    return DeviceProfiles(slowdown, down, up, _availability(config, num_clients))


def _devices(config: SystemConfig, num_clients: int) -> DeviceColumns:
    if config.devices not in DEVICES:  # a model of the researcher's own (rayfed.system.models)
        slowdown, down_mbps, up_mbps = model_devices(config.devices, config.seed, num_clients)
        return slowdown, down_mbps * BYTES_PER_MBIT, up_mbps * BYTES_PER_MBIT
    if config.devices == "trace":
        assert config.device_trace is not None  # SystemConfig pairs them
        path = config.device_trace
        return (table_devices if is_table(path) else fedscale_devices)(path, num_clients)
    down = np.full(num_clients, config.download_mbps * BYTES_PER_MBIT)
    up = np.full(num_clients, config.upload_mbps * BYTES_PER_MBIT)
    if config.devices == "equal":
        return np.ones(num_clients), down, up
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, _DEVICES]))
    slowdown = _lognormal("system.compute_spread", config.compute_spread, rng.standard_normal(num_clients))
    network = _lognormal("system.bandwidth_spread", config.bandwidth_spread, rng.standard_normal(num_clients))
    return slowdown, down * network, up * network  # one draw of the network: a device's link, both ways


def _lognormal(field: str, spread: float, normal: np.ndarray) -> np.ndarray:
    """exp(spread · Z) of each standard normal Z; ConfigError naming ``field`` for a spread so wide that a factor
    leaves float64 (infinite, or 0)."""
    with np.errstate(over="ignore", under="ignore"):
        factors = np.exp(spread * normal)
    client = first_not_positive(factors)
    if client is not None:
        raise ConfigError(
            f"{field}={spread:g} is too wide a spread: client {client}'s draw exp({spread:g} × {normal[client]:.3g}) "
            f"is {float(factors[client])!r}, outside float64; lower {field} (FedScale's tail_skew is 0.6)"
        )
    return factors


def _availability(config: SystemConfig, num_clients: int) -> Availability:
    if config.availability not in AVAILABILITY:  # a model of the researcher's own (rayfed.system.models)
        return model_availability(config.availability, config.seed, num_clients)
    if config.availability == "always":
        return Availability.everyone(num_clients)
    if config.availability == "diurnal":
        rng = np.random.default_rng(np.random.SeedSequence([config.seed, _ONLINE]))
        return diurnal(num_clients, config.online_hours, config.online_start_h, config.online_spread_h, rng)
    assert config.availability_trace is not None  # SystemConfig pairs them
    path = config.availability_trace
    return (table_availability if is_table(path) else fedscale_availability)(path, num_clients)
