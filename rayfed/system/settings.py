"""The ``system`` section of a run's config: the clients' devices, when they are online, and the rules of a round.

Off by default (``system.devices="off"``): no device is modelled and every number of a run is what it is without
this section. docs/system.md explains each field, its formula and the name the systems simulators (FedScale,
FLGo) and papers give it.

>>> SystemConfig(devices="lognormal", deadline_s=120.0).enabled
True
>>> SystemConfig(deadline_s=120.0)
Traceback (most recent call last):
...
rayfed.util.errors.ConfigError: system.deadline_s=120.0 has no effect while system.devices='off' (no device is \
modelled): set system.devices to 'equal', 'lognormal' or 'trace', or leave system.deadline_s out
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rayfed.system.models import AVAILABILITY, DEVICES, check_model_name
from rayfed.util.documented import documented, section
from rayfed.util.errors import ConfigError
from rayfed.util.validation import check, check_choice, check_real, is_int

__all__ = ["SystemConfig", "DEVICES", "AVAILABILITY", "LATE_WORK"]

LATE_WORK = ("drop", "partial")
"""What becomes of a client still training at the deadline: its work is dropped, or the steps it did count."""


@section("system")
@dataclass(frozen=True)
class SystemConfig:
    """The clients' devices (compute speed, bandwidth, availability) and the rules of a round in virtual time."""

    devices: str = documented(
        "off",
        "off (no system model: every client is as fast as any other and always online), equal (every device the "
        "reference device), lognormal (speeds and bandwidths spread around it: system.compute_spread, "
        "system.bandwidth_spread), trace (read from system.device_trace), or the name of a device model of your "
        "own (rayfed.system.register_devices, docs/system.md).",
    )
    device_trace: str | None = documented(
        None,
        "With devices=trace: a FedScale device capacity file (a pickled dict client -> {'computation': ms per "
        "sample, 'communication': kbit/s}, read as plain data only), or a .csv/.parquet table with columns "
        "client_id, slowdown, download_mbps, upload_mbps.",
    )
    step_s: float = documented(
        0.1,
        "Seconds one local step takes on the reference device (slowdown 1); measure it on the run's own model "
        "and machine to put virtual time in that device's seconds.",
    )
    calibrate: bool = documented(
        False,
        "Measure system.step_s before the run: the median seconds of a local round of the client with the most "
        "training samples (the run's own method, model and data), over its steps of all its phases, trained a few "
        "times after a warm-up on this machine (the driver's device); it then stands as system.step_s in the run's "
        "config.json, so that the run and its resume use that number.",
    )
    compute_spread: float = documented(
        0.6,
        "devices=lognormal: σ of ln(slowdown), the log-normal spread of the devices' time per step around the "
        "reference device (the median); FedScale's tail_skew, 0.6.",
    )
    download_mbps: float = documented(20.0, "devices=lognormal or equal: median download bandwidth, Mbit/s.")
    upload_mbps: float = documented(5.0, "devices=lognormal or equal: median upload bandwidth, Mbit/s.")
    bandwidth_spread: float = documented(
        0.5, "devices=lognormal: σ of ln(bandwidth), one draw per device for both directions."
    )
    availability: str = documented(
        "always",
        "always (every client online all the time), diurnal (each client online for system.online_hours a day, "
        "from an hour drawn around system.online_start_h), trace (the windows of system.availability_trace), or the "
        "name of an availability model of your own (rayfed.system.register_availability, docs/system.md).",
    )
    availability_trace: str | None = documented(
        None,
        "With availability=trace: a FedScale client behaviour file (a pickled dict client -> {'active': [s], "
        "'inactive': [s], 'finish_time': s, ...}, read as plain data only), or a .csv/.parquet table with "
        "columns client_id, start_s, end_s, period_s (one row per online window).",
    )
    online_hours: float = documented(
        8.0, "availability=diurnal: hours a day each client is online, in (0, 24] (24 = always)."
    )
    online_start_h: float = documented(
        22.0, "availability=diurnal: the mean hour of the day a client comes online (0 = the run's start)."
    )
    online_spread_h: float = documented(
        3.0, "availability=diurnal: standard deviation, in hours, of the hour each client comes online."
    )
    deadline_s: float | None = documented(
        None,
        "A synchronous round's deadline in virtual seconds: work that has not reached the server by then is "
        "late (FLGo's tolerance for latency, FLASH's round deadline); null = the server waits for every "
        "client it kept.",
    )
    late_work: str = documented(
        "drop",
        "With a deadline: drop (a late client's work is lost) or partial (the steps it finished before it had "
        "to upload count, FLGo's incomplete updates).",
    )
    over_commit: float = documented(
        1.0,
        "Sample this many times the round's clients and keep the first ones that finish (FedScale's "
        "overcommitment, e.g. 1.3); >= 1.",
    )
    dropout: float = documented(
        0.0,
        "Probability, in [0, 1), that a client that started training is lost before it reports (FLGo's "
        "connectivity, prob_drop); its work is never received.",
    )
    target_accuracy: float | None = documented(
        None,
        "A pooled test accuracy in (0, 1] to reach: summary.json then records the virtual time (and the round) of "
        "the first evaluation at or above it; null = none.",
    )
    seed: int = documented(
        1,
        "Seed of the devices drawn (speeds, bandwidths, online hours), in [0, 2**32 - 1]; fixed across training "
        "seeds like data.seed, so that runs with other seeds meet the same devices.",
    )

    @property
    def enabled(self) -> bool:
        """Whether the run models its clients' devices (``devices`` is not "off")."""
        return self.devices != "off"

    def __post_init__(self) -> None:
        check_model_name("system.devices", self.devices)
        check_model_name("system.availability", self.availability)
        check_choice("system.late_work", self.late_work, LATE_WORK)
        if not self.enabled:
            self._refuse_settings_without_devices()
        self._check_trace("devices", self.devices, "device_trace", self.device_trace)
        self._check_trace("availability", self.availability, "availability_trace", self.availability_trace)
        check_real("system.step_s", self.step_s, low=0, low_open=True)
        check_real("system.compute_spread", self.compute_spread, low=0)
        check_real("system.download_mbps", self.download_mbps, low=0, low_open=True)
        check_real("system.upload_mbps", self.upload_mbps, low=0, low_open=True)
        check_real("system.bandwidth_spread", self.bandwidth_spread, low=0)
        check_real("system.online_hours", self.online_hours, low=0, high=24, low_open=True)
        check_real("system.online_start_h", self.online_start_h, low=0, high=24, high_open=True)
        check_real("system.online_spread_h", self.online_spread_h, low=0)
        if self.deadline_s is not None:
            check_real("system.deadline_s", self.deadline_s, low=0, low_open=True)
        check(
            self.late_work == "drop" or self.deadline_s is not None,
            "system.late_work",
            self.late_work,
            "'drop' while no system.deadline_s is set (partial work is what a client did by the deadline)",
        )
        check_real("system.over_commit", self.over_commit, low=1)
        check_real("system.dropout", self.dropout, low=0, high=1, high_open=True)
        check(isinstance(self.calibrate, bool), "system.calibrate", self.calibrate, "true or false")
        if self.target_accuracy is not None:
            check_real("system.target_accuracy", self.target_accuracy, low=0, high=1, low_open=True)
        check(is_int(self.seed) and 0 <= self.seed < 2**32, "system.seed", self.seed, "an integer in [0, 2**32 - 1]")

    def _refuse_settings_without_devices(self) -> None:
        """With ``devices="off"`` every other field must keep its default: a value set there would be ignored."""
        for field in dataclasses.fields(self):
            value, default = getattr(self, field.name), field.default
            if field.name != "devices" and value != default:
                raise ConfigError(
                    f"system.{field.name}={value!r} has no effect while system.devices='off' (no device is "
                    f"modelled): set system.devices to 'equal', 'lognormal' or 'trace', or leave "
                    f"system.{field.name} out"
                )

    @staticmethod
    def _check_trace(kind: str, source: str, field: str, path: str | None) -> None:
        """``system.<kind>="trace"`` and ``system.<field>`` go together."""
        if source == "trace" and not path:
            raise ConfigError(
                f"system.{kind}='trace' needs the file to read: set system.{field} to its path, or choose another "
                f"system.{kind}"
            )
        if source != "trace" and path is not None:
            raise ConfigError(
                f"system.{field}={path!r} is read only with system.{kind}='trace', but got system.{kind}={source!r}: "
                f"set system.{kind}='trace', or leave system.{field} out"
            )
