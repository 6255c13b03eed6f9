"""The ``system`` section: off by default, each bad value refused in one line naming the field and the fix."""

from __future__ import annotations

import dataclasses

import pytest

from rayfed.system import SystemConfig
from rayfed.util.config_tree import from_mapping
from rayfed.util.documented import reference
from rayfed.util.errors import ConfigError


def test_the_default_models_no_device() -> None:
    config = SystemConfig()
    assert not config.enabled and config.devices == "off" and config.availability == "always"
    assert config.deadline_s is None and config.over_commit == 1.0 and config.dropout == 0.0


def test_every_field_is_documented_with_its_default() -> None:
    text = reference(SystemConfig)
    for field in dataclasses.fields(SystemConfig):
        assert f"system.{field.name} = " in text


def test_a_section_is_built_from_a_table_as_a_config_file_writes_it() -> None:
    config = from_mapping(SystemConfig, {"devices": "lognormal", "deadline_s": 90, "late_work": "partial"}, "system")
    assert config.enabled and config.deadline_s == 90 and config.late_work == "partial"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"deadline_s": 60.0},
            "system.deadline_s=60.0 has no effect while system.devices='off' (no device is modelled): set "
            "system.devices to 'equal', 'lognormal' or 'trace', or leave system.deadline_s out",
        ),
        (
            {"devices": "trace"},
            "system.devices='trace' needs the file to read: set system.device_trace to its path, or choose another "
            "system.devices",
        ),
        (
            {"devices": "equal", "availability_trace": "b.pkl"},
            "system.availability_trace='b.pkl' is read only with system.availability='trace', but got "
            "system.availability='always': set system.availability='trace', or leave system.availability_trace out",
        ),
        (
            {"devices": "equal", "late_work": "partial"},
            "system.late_work must be 'drop' while no system.deadline_s is set (partial work is what a client did by "
            "the deadline), but got system.late_work='partial'",
        ),
        ({"devices": "equal", "step_s": -0.1}, "system.step_s must be a finite number > 0, but got system.step_s=-0.1"),
        (
            {"devices": "equal", "over_commit": 0.8},
            "system.over_commit must be a finite number >= 1, but got system.over_commit=0.8",
        ),
        (
            {"devices": "equal", "dropout": 1.0},
            "system.dropout must be a finite number in [0, 1), but got system.dropout=1.0",
        ),
        (
            {"devices": "equal", "deadline_s": 0.0},
            "system.deadline_s must be a finite number > 0, but got system.deadline_s=0.0",
        ),
        (
            {"devices": "equal", "online_hours": 25.0},
            "system.online_hours must be a finite number in (0, 24], but got system.online_hours=25.0",
        ),
        (
            {"devices": "lognormal", "download_mbps": 0},
            "system.download_mbps must be a finite number > 0, but got system.download_mbps=0",
        ),
        # the presets first, then any model a script registered (an example run earlier in this process)
        ({"devices": "gpu"}, "system.devices must be one of 'off', 'equal', 'lognormal', 'trace'"),
    ],
)
def test_bad_values_are_refused_in_one_line(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        SystemConfig(**fields)  # type: ignore[arg-type]
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_a_value_of_another_type_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"system.deadline_s must be a finite number > 0, but got "):
        SystemConfig(devices="equal", deadline_s="60")  # type: ignore[arg-type]
