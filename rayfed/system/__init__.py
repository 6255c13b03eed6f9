"""The clients' systems in the simulation: their devices, when they are online, and a virtual clock.

Numpy only (no torch, no Ray), below the training code: the round loop asks it, each synchronous round, whom
to sample and whose work counts (:class:`SyncRounds`), or, for asynchronous aggregation, which clients train from
which model version and when their updates arrive (:class:`AsyncSchedule`). Off by default
(``system.devices="off"``). docs/system.md explains the model and its formulas.
"""

from rayfed.system.availability import Availability, diurnal
from rayfed.system.clock import ClientTimes, Workload, client_times, steps_within
from rayfed.system.models import register_availability, register_devices
from rayfed.system.profiles import DeviceProfiles, load_profiles
from rayfed.system.rounds import RoundOutcome, SyncRounds, settle_round
from rayfed.system.schedule import AsyncSchedule, AsyncState, ServerStep, VersionPlan
from rayfed.system.settings import SystemConfig
from rayfed.system.status import STATUS_NAMES, ClientStatus, counted

__all__ = [
    "Availability",
    "diurnal",
    "ClientTimes",
    "Workload",
    "client_times",
    "steps_within",
    "DeviceProfiles",
    "load_profiles",
    "register_devices",
    "register_availability",
    "RoundOutcome",
    "SyncRounds",
    "settle_round",
    "AsyncSchedule",
    "AsyncState",
    "ServerStep",
    "VersionPlan",
    "SystemConfig",
    "STATUS_NAMES",
    "ClientStatus",
    "counted",
]
