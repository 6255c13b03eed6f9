"""Device and availability models of a researcher's own, registered from their script or module like a method.

``system.devices`` and ``system.availability`` name a preset or a trace file (docs/system.md), or a model
registered here: a function of the run's ``system.seed`` and its number of clients M, called once on the driver,
before anything is written, so that a run with one stays seeded like every other::

    @register_devices("phone_classes")
    def phone_classes(seed: int, num_clients: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ...  # (slowdown, download_mbps, upload_mbps), M finite numbers > 0 each

    @register_availability("regional_outages")
    def regional_outages(seed: int, num_clients: int) -> Availability:
        ...  # Availability.from_windows(client ids, window starts, window ends, each client's period, M, name)

FLGo's users write the same rules in code (its simulator's availability, responsiveness and connectivity
updates); FedScale reads them from its device and behaviour traces. A model registered in the script that runs, or
in a module the config's ``plugins`` lists, reaches a run's other processes as a method's code does, and its file
is sealed in the run's marker like a plugin's (:mod:`rayfed.util.plugins`, :mod:`rayfed.provenance.run_seal`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rayfed.system.availability import Availability
from rayfed.system.checks import refuse_not_positive
from rayfed.util.errors import ConfigError
from rayfed.util.registry import Registry, caller_module
from rayfed.util.validation import check_choice

__all__ = [
    "DEVICES",
    "AVAILABILITY",
    "DeviceModel",
    "AvailabilityModel",
    "DEVICE_MODELS",
    "AVAILABILITY_MODELS",
    "register_devices",
    "register_availability",
    "check_model_name",
    "model_devices",
    "model_availability",
]

DEVICES = ("off", "equal", "lognormal", "trace")
"""The presets of ``system.devices``: none, one reference device for all, a lognormal spread, a trace file."""
AVAILABILITY = ("always", "diurnal", "trace")
"""The presets of ``system.availability``: always, a daily window each, a trace file's windows."""

DeviceModel = Callable[[int, int], tuple[Any, Any, Any]]
"""(system.seed, M) -> (slowdown, download_mbps, upload_mbps), one array of M numbers each."""
AvailabilityModel = Callable[[int, int], Availability]
"""(system.seed, M) -> every client's online windows."""

DEVICE_MODELS: Registry[DeviceModel] = Registry("device model", field="system.devices")
AVAILABILITY_MODELS: Registry[AvailabilityModel] = Registry("availability model", field="system.availability")
_PRESETS = {"system.devices": DEVICES, "system.availability": AVAILABILITY}
_COLUMNS = ("slowdown", "download_mbps", "upload_mbps")


def register_devices(name: str) -> Callable[[DeviceModel], DeviceModel]:
    """Register a device model under ``name``, which ``system.devices`` then names (module docstring)."""
    _check_new(name, "system.devices")
    return DEVICE_MODELS.register(name, origin=caller_module())


def register_availability(name: str) -> Callable[[AvailabilityModel], AvailabilityModel]:
    """Register an availability model under ``name``, which ``system.availability`` then names."""
    _check_new(name, "system.availability")
    return AVAILABILITY_MODELS.register(name, origin=caller_module())


def _check_new(name: str, field: str) -> None:
    if not isinstance(name, str) or not name or name in _PRESETS[field]:
        raise ValueError(f"a model's name must be a string other than {field}'s presets {_PRESETS[field]}: {name!r}")


def check_model_name(field: str, value: Any) -> None:
    """``value`` is one of ``field``'s presets (``system.devices`` or ``system.availability``) or the name of a
    model registered for it; else ConfigError listing both."""
    registry, presets = (DEVICE_MODELS if field == "system.devices" else AVAILABILITY_MODELS), _PRESETS[field]
    if isinstance(value, str) and (value in presets or value in registry):
        return
    check_choice(field, value, (*presets, *registry.names()))


def model_devices(name: str, seed: int, num_clients: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The devices the model ``name`` draws for ``num_clients`` clients from ``seed``: (slowdown, download_mbps,
    upload_mbps); ConfigError naming the model, the client and the fix for what is not M finite numbers > 0."""
    field = f"system.devices={name!r}"
    made = DEVICE_MODELS.get(name)(seed, num_clients)
    if not isinstance(made, tuple | list) or len(made) != len(_COLUMNS):
        raise ConfigError(
            f"{field}: the model returned {type(made).__name__}; return ({', '.join(_COLUMNS)}), one array of "
            f"{num_clients} numbers each"
        )
    columns = []
    for column, values in zip(_COLUMNS, made):
        try:
            array = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{field}: its {column} is not numbers ({error}); return {num_clients} numbers") from None
        if array.shape != (num_clients,):
            raise ConfigError(
                f"{field}: its {column} has shape {array.shape}; return one number per client, shape ({num_clients},)"
            )
        refuse_not_positive(array, field, column)
        columns.append(array)
    slowdown, down, up = columns
    return slowdown, down, up


def model_availability(name: str, seed: int, num_clients: int) -> Availability:
    """The online windows the model ``name`` draws for ``num_clients`` clients from ``seed``; ConfigError naming
    the model for anything but an :class:`~rayfed.system.availability.Availability` of that many clients."""
    made = AVAILABILITY_MODELS.get(name)(seed, num_clients)
    if not isinstance(made, Availability) or made.num_clients != num_clients:
        what = f"windows of {made.num_clients} clients" if isinstance(made, Availability) else type(made).__name__
        raise ConfigError(
            f"system.availability={name!r}: the model returned {what}; return an Availability of the run's "
            f"{num_clients} clients (Availability.from_windows, or Availability.everyone)"
        )
    return made
