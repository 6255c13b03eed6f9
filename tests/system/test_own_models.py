"""Device and availability models of a researcher's own (rayfed.system.models): named by the config like a preset,
drawn from system.seed, refused in one line naming the model when what they return is not devices, and carried to
a run's other processes like a method registered in a script."""

from __future__ import annotations

import numpy as np
import pytest

from rayfed import RunConfig
from rayfed.system import Availability, SystemConfig, load_profiles
from rayfed.system.models import AVAILABILITY_MODELS, DEVICE_MODELS, register_availability, register_devices
from rayfed.util import plugins
from rayfed.util.errors import ConfigError


@pytest.fixture(autouse=True)
def _registries(monkeypatch):
    """The models a test registers are gone after it."""
    for registry in (DEVICE_MODELS, AVAILABILITY_MODELS):
        monkeypatch.setattr(registry, "_items", dict(registry._items))
        monkeypatch.setattr(registry, "_origins", dict(registry._origins))


def _halves(seed: int, num_clients: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    slowdown = np.where(np.arange(num_clients) < num_clients // 2, 1.0, 4.0)
    scale = np.random.default_rng(seed).uniform(1.0, 2.0, num_clients)
    return slowdown, 20.0 * scale, 5.0 * scale


def _evens_first_half(seed: int, num_clients: int) -> Availability:
    evens = np.arange(0, num_clients, 2)
    return Availability.from_windows(
        evens, np.zeros(len(evens)), np.full(len(evens), 50.0), np.full(num_clients, 100.0), num_clients, "evens"
    )


def test_a_registered_model_gives_the_runs_devices_from_its_seed() -> None:
    register_devices("halves")(_halves)
    register_availability("evens")(_evens_first_half)
    config = SystemConfig(devices="halves", availability="evens", seed=7)
    devices = load_profiles(config, 10)
    assert devices is not None
    assert devices.slowdown.tolist() == [1.0] * 5 + [4.0] * 5
    assert np.array_equal(devices.download_bps, _halves(7, 10)[1] * 125_000)
    assert devices.availability.online(np.arange(10), 10.0).tolist() == [True, False] * 5
    assert not devices.availability.online(np.arange(10), 60.0).any()


def test_an_unknown_name_lists_the_presets_and_the_registered_models() -> None:
    register_devices("halves")(_halves)
    with pytest.raises(ConfigError, match=r"must be one of 'off', .*'halves'.*, but got system.devices='halvs'"):
        SystemConfig(devices="halvs")


def test_a_preset_name_cannot_be_registered() -> None:
    with pytest.raises(ValueError, match="other than system.devices's presets"):
        register_devices("lognormal")(_halves)


@pytest.mark.parametrize(
    ("made", "message"),
    [
        (lambda seed, m: np.ones(m), r"system.devices='bad': the model returned ndarray; return \(slowdown, "),
        (lambda seed, m: (np.ones(m), np.ones(m + 1), np.ones(m)), r"its download_mbps has shape \(5,\); return one"),
        (lambda seed, m: (np.ones(m), np.ones(m), np.array([1, 1, 0, 1])), r"client 2's upload_mbps is 0.0; it must"),
        (lambda seed, m: (np.ones(m), ["fast"] * m, np.ones(m)), r"its download_mbps is not numbers"),
    ],
)
def test_what_is_not_devices_is_refused_in_one_line_naming_the_model(made, message) -> None:
    register_devices("bad")(made)
    with pytest.raises(ConfigError, match=message):
        load_profiles(SystemConfig(devices="bad"), 4)


def test_an_availability_model_must_return_the_runs_clients_windows() -> None:
    register_availability("few")(lambda seed, m: Availability.everyone(m - 1))
    with pytest.raises(ConfigError, match=r"system.availability='few': the model returned windows of 3 clients; "):
        load_profiles(SystemConfig(devices="equal", availability="few"), 4)


def test_a_model_registered_in_a_script_travels_by_value_to_another_process() -> None:
    # Prepare: a model registered by a script's __main__, and the config of a run that names it
    DEVICE_MODELS.register("halves", origin="__main__")(_halves)
    config = RunConfig().override({"system.devices": "halves"})
    assert [(name, origin) for _, name, _, origin in plugins.plugin_registrations(config)] == [("halves", "__main__")]
    blob = plugins.pack(config)
    # Execute: another process, which has not registered it
    del DEVICE_MODELS._items["halves"], DEVICE_MODELS._origins["halves"]
    received = plugins.unpack(blob)
    # Assert: the model is there again, and the config names it
    assert received.system.devices == "halves" and DEVICE_MODELS.origin("halves") == "__main__"
    assert DEVICE_MODELS.get("halves")(3, 4)[0].tolist() == [1.0, 1.0, 4.0, 4.0]
