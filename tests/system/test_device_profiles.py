"""Device profiles: drawn from system.seed as documented, the same for every run that asks, cheap at 100,000."""

from __future__ import annotations

import numpy as np
import pytest

from rayfed.system import Availability, DeviceProfiles, SystemConfig, load_profiles
from rayfed.system.profiles import BYTES_PER_MBIT
from rayfed.util.errors import ConfigError


def test_equal_devices_are_the_reference_device() -> None:
    devices = load_profiles(SystemConfig(devices="equal", download_mbps=8.0, upload_mbps=2.0), 50)
    assert devices is not None
    assert devices.slowdown.tolist() == [1.0] * 50
    assert devices.download_bps.tolist() == [1e6] * 50 and devices.upload_bps.tolist() == [2.5e5] * 50
    assert devices.availability.always


def test_lognormal_devices_spread_around_the_reference_device() -> None:
    config = SystemConfig(devices="lognormal", compute_spread=0.6, bandwidth_spread=0.5, download_mbps=20.0)
    devices = load_profiles(config, 20_000)
    assert devices is not None
    log_slowdown, log_down = np.log(devices.slowdown), np.log(devices.download_bps / (20.0 * BYTES_PER_MBIT))
    assert abs(np.median(log_slowdown)) < 0.02 and abs(log_slowdown.std() - 0.6) < 0.02
    assert abs(np.median(log_down)) < 0.02 and abs(log_down.std() - 0.5) < 0.02
    # one draw per device's link: its upload is as far from the median as its download
    assert np.allclose(devices.upload_bps / devices.download_bps, 5.0 / 20.0)


def test_the_same_seed_draws_the_same_devices_and_a_longer_run_extends_them() -> None:
    config = SystemConfig(devices="lognormal", availability="diurnal")
    few, many = load_profiles(config, 100), load_profiles(config, 1000)
    again = load_profiles(config, 100)
    other = load_profiles(SystemConfig(devices="lognormal", availability="diurnal", seed=2), 100)
    assert few is not None and many is not None and again is not None and other is not None
    assert np.array_equal(few.slowdown, again.slowdown) and np.array_equal(few.slowdown, many.slowdown[:100])
    assert np.array_equal(few.availability.starts, again.availability.starts)
    assert not np.array_equal(few.slowdown, other.slowdown)


def test_100000_clients_profiles_take_a_few_megabytes() -> None:
    devices = load_profiles(SystemConfig(devices="lognormal", availability="diurnal"), 100_000)
    assert devices is not None and devices.num_clients == 100_000
    # 3 float64 arrays of the devices, and the diurnal windows (one or two a client): about 7 MB
    assert 3 * 8 * 100_000 < devices.nbytes < 8_000_000


def test_a_negative_speed_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^client 1's device has slowdown=-2.0; speeds and bandwidths must be"):
        DeviceProfiles(np.array([1.0, -2.0]), np.ones(2), np.ones(2), Availability.everyone(2))
