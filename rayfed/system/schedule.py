"""Asynchronous aggregation in virtual time: which client trains from which model version, and when its update
reaches the server.

FedBuff (Nguyen et al., AISTATS 2022) and FedAsync (Xie et al., 2019) keep ``C`` clients training at once (the
concurrency); each update that arrives enters the server's buffer, and every ``K`` arrivals (the buffer size;
FedAsync is ``K = 1``) the server makes a new model version. A client that reports (or drops out, or goes
offline) frees its slot, and a new client, drawn uniformly among those online and not training, starts at once
from the model version of that moment (FedScale's asynchronous aggregator keeps its concurrency the same way).
A client launched from version τ whose update is applied in the step that makes version t + 1 has staleness
``t − τ``, the argument of the methods' staleness weights s(t − τ).

Who trains when, and when each one arrives, depends only on the devices, the workload and the seeds, never on
the models, so the schedule is simulated in virtual-time order ahead of the training: the clients launched from
one version are known before any of them trains, and train as one call from that version's model, each one's
update kept until the step it arrives in (:meth:`AsyncSchedule.plan`). The event queue is a small state
(:class:`AsyncState`, a few arrays of length ``C``) that a checkpoint saves: a resumed run simulates from it the
same events.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from rayfed.system.clock import Workload, client_times
from rayfed.system.limits import check_reports
from rayfed.system.profiles import DeviceProfiles
from rayfed.system.settings import SystemConfig
from rayfed.system.status import ClientStatus
from rayfed.util.errors import ConfigError
from rayfed.util.validation import check_int

__all__ = ["AsyncState", "ServerStep", "VersionPlan", "AsyncSchedule"]

_ASYNC = 22
"""The run seed's stream of the asynchronous launches (apart from sampling, batches and dropouts)."""
_WAITING = -1
"""The client id of a slot that waits for a client to come online."""
_STALLED = 100_000
"""Launches lost between two server steps after which the schedule stops: it would wait for K arrivals forever."""
_TRIES = 8
"""Clients drawn at a time while looking for one that is online and idle, before listing them all."""


@dataclass(frozen=True)
class AsyncState:
    """The event queue between two server steps: the virtual time, the model version, the buffer's fill, the
    slots still to fill, the launch counter, and every client in flight (or slot waiting for one) with the
    version it started from, when it frees its slot, reporting or not, and when it started (``start_s``)."""

    now_s: float
    version: int
    buffered: int
    free: int
    launches: int
    client_id: np.ndarray
    launch_index: np.ndarray
    launch_version: np.ndarray
    end_s: np.ndarray
    status: np.ndarray
    start_s: np.ndarray

    @classmethod
    def start(cls, concurrency: int) -> AsyncState:
        """Before anything: version 0 at time 0, ``concurrency`` slots to fill."""
        none = np.zeros(0, dtype=np.int64)
        return cls(0.0, 0, 0, concurrency, 0, none, none, none, np.zeros(0), np.zeros(0, dtype=np.int8), np.zeros(0))

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The state as arrays for a checkpoint's ``.npz`` (no pickle)."""
        counters = np.array([self.version, self.buffered, self.free, self.launches], dtype=np.int64)
        return {
            "now_s": np.array([self.now_s]),
            "counters": counters,
            "client_id": self.client_id,
            "launch_index": self.launch_index,
            "launch_version": self.launch_version,
            "end_s": self.end_s,
            "status": self.status,
            "start_s": self.start_s,
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> AsyncState:
        """The state :meth:`to_arrays` saved; a checkpoint from before the launch times were kept gives its clients
        in flight an unknown (NaN) ``start_s``: the same schedule, those clients' rows' ``start_s`` unknown."""
        version, buffered, free, launches = (int(v) for v in arrays["counters"])
        queue = {k: np.asarray(arrays[k]) for k in ("client_id", "launch_index", "launch_version", "end_s", "status")}
        start_s = np.asarray(arrays.get("start_s", np.full(len(queue["end_s"]), np.nan)))
        return cls(float(arrays["now_s"][0]), version, buffered, free, launches, **queue, start_s=start_s)


@dataclass(frozen=True)
class ServerStep:
    """One server step: the version it makes, when, the updates applied (in arrival order), the clients lost
    since the previous step, the clients launched from the previous version, and the state after it."""

    version: int
    time_s: float
    arrived: np.ndarray
    """int64 client ids whose updates this step applies, in arrival order."""
    arrived_launch: np.ndarray
    """int64 launch index of each arrival (a client may train again later under another index)."""
    staleness: np.ndarray
    """int64 ``(version − 1) − τ`` of each arrival, τ the version it started from."""
    arrived_s: np.ndarray
    """float64 ``(n, 2)``: each arrival's launch and arrival virtual times (the last arrival's is ``time_s``)."""
    lost: np.ndarray
    """int64 client ids that dropped out or went offline since the previous step: their work never arrives."""
    lost_launch: np.ndarray
    """int64 launch index of each lost client."""
    lost_status: np.ndarray
    """int8 :class:`~rayfed.system.status.ClientStatus` of each lost client (OFFLINE or DROPPED)."""
    lost_start_s: np.ndarray
    """float64 launch virtual time of each lost client."""
    lost_s: np.ndarray
    """float64 virtual time at which each lost client's loss reached the server: the instant it dropped out or went
    offline, when its slot frees and another client is launched."""
    launched: np.ndarray
    """int64 client ids launched from version ``version − 1``, in launch order."""
    launched_index: np.ndarray
    state: AsyncState
    """The schedule's state right after this step: what a checkpoint taken at this version saves."""


@dataclass(frozen=True)
class VersionPlan:
    """What the training loop needs at model version ``version``: the clients launched from it (one training
    call), the version each one's update is applied to make (-1: it never arrives within the run), and the step
    that makes version ``version + 1``."""

    version: int
    launched: np.ndarray
    arrives_at: np.ndarray
    step: ServerStep

    @property
    def to_train(self) -> np.ndarray:
        """The launched clients whose updates will be applied: the others' work is never used."""
        return self.launched[self.arrives_at >= 0]


class AsyncSchedule:
    """The asynchronous schedule of a run (module docstring), simulated ahead of the training as far as the
    training needs and never past ``last_version``."""

    def __init__(
        self,
        config: SystemConfig,
        devices: DeviceProfiles,
        work: Workload,
        seed: int,
        *,
        concurrency: int,
        buffer_size: int,
        last_version: int,
        state: AsyncState | None = None,
        fields: str = "algorithm.params",
    ) -> None:
        check_int(f"{fields}.concurrency", concurrency, low=1, high=devices.num_clients)
        check_int(f"{fields}.buffer_size", buffer_size, low=1)
        if buffer_size > concurrency:
            raise ConfigError(
                f"{fields}.buffer_size={buffer_size} is larger than {fields}.concurrency={concurrency}: the server "
                f"would wait for more updates than clients train at once; set {fields}.buffer_size to at most "
                f"{concurrency}, or raise {fields}.concurrency"
            )
        windows = np.diff(devices.availability.offsets) > 0
        ever_online = devices.num_clients if devices.availability.always else int(windows.sum())
        if concurrency > ever_online:
            raise ConfigError(
                f"{fields}.concurrency={concurrency} is more than the {ever_online} clients that are ever online "
                f"(system.availability): lower {fields}.concurrency to at most {ever_online}"
            )
        self.config, self.devices, self.seed = config, devices, seed
        self.concurrency, self.buffer_size, self.last_version = concurrency, buffer_size, last_version
        self.round_s = client_times(devices, work, np.arange(devices.num_clients), step_s=config.step_s).total_s
        """Each client's time from its launch to its report, Eq. (1) of :mod:`rayfed.system.clock`."""
        check_reports(config, devices, self.round_s)
        self._state = state or AsyncState.start(concurrency)
        self._steps: dict[int, ServerStep] = {}
        self._arrives: dict[int, int] = {}
        """Launch index -> the version its update makes; resolved launches that never arrive map to -1."""

    @property
    def state(self) -> AsyncState:
        """The state of the simulation's front (ahead of the training; checkpoint a step's ``state`` instead)."""
        return self._state

    def plan(self, version: int) -> VersionPlan:
        """The clients launched from ``version`` and the step that makes ``version + 1``, simulating as far as it
        takes to know where each of those clients' updates arrives. Versions are asked for in increasing order,
        from the state the schedule started at."""
        step = self._step(version + 1)
        launched = step.launched_index
        while not all(int(i) in self._arrives for i in launched) and self._state.version < self.last_version:
            self._step(self._state.version + 1)
        arrives = np.array([self._arrives.get(int(i), -1) for i in launched], dtype=np.int64)
        if len(launched):  # launch indices grow with the version: none up to these is asked for again
            newest = int(launched.max())
            self._arrives = {i: v for i, v in self._arrives.items() if i > newest}
        self._steps = {v: made for v, made in self._steps.items() if v > version + 1}
        return VersionPlan(version, step.launched, arrives, step)

    def _step(self, version: int) -> ServerStep:
        while version not in self._steps:
            made = _Segment(self, self._state).run()
            self._steps[made.version] = made
            self._state = made.state
            self._arrives.update(dict.fromkeys(made.arrived_launch.tolist(), made.version))
            self._arrives.update(dict.fromkeys(made.lost_launch.tolist(), -1))
        return self._steps[version]


class _Segment:
    """The events from one server step to the next, in virtual-time order (ties: the earlier launch first, and
    every event of an instant before the slots it frees are filled: :meth:`run`)."""

    def __init__(self, schedule: AsyncSchedule, state: AsyncState) -> None:
        self.schedule, self.availability = schedule, schedule.devices.availability
        self.now, self.version, self.buffered, self.launches = (
            state.now_s,
            state.version,
            state.buffered,
            state.launches,
        )
        self.free = state.free
        self.queue = list(
            zip(
                state.end_s.tolist(),
                state.launch_index.tolist(),
                state.client_id.tolist(),
                state.launch_version.tolist(),
                state.status.tolist(),
                state.start_s.tolist(),
                strict=True,
            )
        )
        heapq.heapify(self.queue)
        self.busy = np.zeros(schedule.devices.num_clients, dtype=bool)
        self.busy[state.client_id[state.client_id >= 0]] = True
        self.rng = np.random.default_rng(np.random.SeedSequence([schedule.seed, _ASYNC, state.version]))
        self.arrived: list[tuple[int, int, int]] = []
        self.lost: list[tuple[int, int, int]] = []
        self.arrived_s: list[tuple[float, float]] = []
        self.lost_start_s: list[float] = []
        self.lost_s: list[float] = []
        self.launched: list[tuple[int, int]] = []

    def run(self) -> ServerStep:
        """Take events until the buffer holds ``K`` updates: the server step. Simultaneous events go in a fixed
        order (docs/system.md): every event of one instant is taken, in launch order, the server stepping whenever
        the buffer fills, before the slots they free are filled, from the newest version."""
        while True:  # never dry: a slot's own client, idle once it ends, comes online again (__init__)
            if not self.queue or self.queue[0][0] > self.now:  # the instant's events are all taken
                for _ in range(self.free):
                    self._launch()
                self.free = 0
            end, index, client, launched_from, status, start = heapq.heappop(self.queue)
            self.now, self.free = end, self.free + 1
            if client == _WAITING:
                continue
            self.busy[client] = False
            if status != ClientStatus.FINISHED:
                self.lost.append((client, index, status))
                self.lost_start_s.append(start)
                self.lost_s.append(end)
                self._check_stalled()
                continue
            self.arrived.append((client, index, self.version - launched_from))
            self.arrived_s.append((start, end))
            self.buffered += 1
            if self.buffered == self.schedule.buffer_size:
                return self._server_step()

    def _check_stalled(self) -> None:
        """ConfigError once the step has lost :data:`_STALLED` launches without an arrival: a schedule that cannot
        step (its clients online too briefly, or dropping out nearly always) stops with its reason, not a hang."""
        if len(self.lost) >= _STALLED:
            raise ConfigError(
                f"the asynchronous schedule stopped at virtual time {self.now:.6g} s: {len(self.lost):,} launches "
                f"since version {self.version} dropped out or went offline and {self.buffered} of the "
                f"{self.schedule.buffer_size} updates its server waits for arrived; give the clients longer online "
                "windows (system.availability) or lower system.dropout, the work (train.local_epochs) or system.step_s"
            )

    def _launch(self) -> None:
        """Start a client drawn among those online and idle now, from the current version; or, with none, let the
        slot wait until one comes online."""
        index = self.launches
        self.launches += 1
        client = self._pick()
        if client is None:  # wait for the first idle client to come online (one always does: __init__)
            wake = float(self.availability.next_online(np.flatnonzero(~self.busy), self.now).min())
            heapq.heappush(self.queue, (wake, index, _WAITING, self.version, ClientStatus.FINISHED, self.now))
            return
        duration = float(self.schedule.round_s[client])
        end, status = self.now + duration, ClientStatus.FINISHED
        if self.schedule.config.dropout > 0:
            lost, when = self.rng.random(2)
            if lost < self.schedule.config.dropout:
                end, status = self.now + when * duration, ClientStatus.DROPPED
        until = float(self.availability.online_until(np.array([client]), self.now)[0])
        if until < end:
            end, status = until, ClientStatus.OFFLINE
        self.busy[client] = True
        heapq.heappush(self.queue, (end, index, client, self.version, int(status), self.now))
        self.launched.append((client, index))

    def _pick(self) -> int | None:
        """A client drawn uniformly among those online and not training (rejection sampling, then, if a few draws
        find none, a draw among all of them); None if there is none."""
        drawn = self.rng.integers(self.busy.size, size=_TRIES)
        fits = drawn[~self.busy[drawn]]
        fits = fits[self.availability.online(fits, self.now)]
        if len(fits):
            return int(fits[0])
        idle = np.flatnonzero(~self.busy)
        idle = idle[self.availability.online(idle, self.now)]
        return int(idle[self.rng.integers(len(idle))]) if len(idle) else None

    def _server_step(self) -> ServerStep:
        self.version += 1
        pending = sorted(self.queue, key=lambda event: event[1])
        columns = list(zip(*pending, strict=True)) or [()] * 6
        end_s, index, client, launched_from, status, start_s = columns
        state = AsyncState(
            self.now,
            self.version,
            0,
            self.free,
            self.launches,
            np.array(client, dtype=np.int64),
            np.array(index, dtype=np.int64),
            np.array(launched_from, dtype=np.int64),
            np.array(end_s, dtype=np.float64),
            np.array(status, dtype=np.int8),
            np.array(start_s, dtype=np.float64),
        )
        arrived, lost, launched = (
            np.array(rows, dtype=np.int64).reshape(-1, width)
            for rows, width in ((self.arrived, 3), (self.lost, 3), (self.launched, 2))
        )
        return ServerStep(
            self.version,
            self.now,
            arrived[:, 0],
            arrived[:, 1],
            arrived[:, 2],
            np.array(self.arrived_s, dtype=np.float64).reshape(-1, 2),
            lost[:, 0],
            lost[:, 1],
            lost[:, 2].astype(np.int8),
            np.array(self.lost_start_s, dtype=np.float64),
            np.array(self.lost_s, dtype=np.float64),
            launched[:, 0],
            launched[:, 1],
            state,
        )
