"""The run's system model, made and checked before anything is written: :func:`plan_rounds`.

From the ``system`` section (docs/system.md) it loads every client's device (:func:`~rayfed.system.load_profiles`:
presets or trace files, a bad one refused in one line), works out each client's round from its method's own work
(:func:`~rayfed.scheduling.workload.method_workload`, each upload charged secure aggregation's bytes where
``privacy.secure_aggregation`` asks) and builds what the round loop asks each round
(:mod:`rayfed.scheduling.sync_rounds`): synchronous rounds in virtual time, whose deadline must be one some device
meets, or, for an asynchronous method (its server half declares
:class:`~rayfed.algorithms.declarations.AsynchronousAggregation`), its schedule, whose buffer must fit its
concurrency and whose concurrency the clients online.
"""

from __future__ import annotations

from rayfed.algorithms import ResolvedAlgorithm
from rayfed.algorithms.declarations import AsynchronousAggregation
from rayfed.config import RunConfig
from rayfed.engine.inputs import RunInputs
from rayfed.scheduling.async_rounds import UNBOUNDED, AsyncRounds
from rayfed.scheduling.sync_rounds import Rounds, VirtualRounds
from rayfed.scheduling.workload import method_workload
from rayfed.system import AsyncSchedule, AsyncState, DeviceProfiles, SyncRounds, Workload, load_profiles
from rayfed.system.limits import check_clock
from rayfed.util.errors import ConfigError

__all__ = ["plan_rounds", "is_asynchronous"]


def is_asynchronous(algorithm: ResolvedAlgorithm) -> bool:
    """Whether the run's method aggregates asynchronously: its server half declares so
    (:class:`~rayfed.algorithms.declarations.AsynchronousAggregation`)."""
    return issubclass(algorithm.algorithm.server_half, AsynchronousAggregation)


def plan_rounds(config: RunConfig, algorithm: ResolvedAlgorithm, inputs: RunInputs) -> Rounds:
    """What the round loop asks each round of ``config``'s run; ConfigError naming the field for a system model the
    run cannot have (a bad trace, a deadline no device meets, a buffer beyond the concurrency, ...)."""
    asynchronous = is_asynchronous(algorithm)
    _check_kind(config, algorithm, asynchronous)
    system = config.system
    if not system.enabled:
        return Rounds(config)
    devices = load_profiles(system, config.data.num_clients)
    assert devices is not None  # system.devices is on
    work, by_round = method_workload(config, algorithm, inputs)
    check_clock(system, devices, work, config.train.rounds)
    if not asynchronous:
        sync = SyncRounds(system, devices, work, config.seed, config.engine.join_ratio)
        return VirtualRounds(config, sync, by_round)
    if by_round is not None:
        raise ConfigError(
            f"algorithm.client={config.algorithm.client or algorithm.name!r} gives each client a work that changes "
            f"from round to round, which the asynchronous schedule of algorithm.name={algorithm.name!r}, simulated "
            "ahead of the training, cannot time: lend it the phases of a method whose rounds are alike (fedavg, "
            "fedprox, ...)"
        )
    server_half = algorithm.algorithm.server_half
    assert issubclass(server_half, AsynchronousAggregation)  # is_asynchronous
    shape = server_half.schedule(algorithm.server_params)
    return AsyncRounds(config, lambda state: _schedule(config, shape, devices, work, state))


def _schedule(
    config: RunConfig, shape: tuple[int, int], devices: DeviceProfiles, work: Workload, state: AsyncState | None
) -> AsyncSchedule:
    """The schedule of concurrency and buffer ``shape`` (the half's :meth:`AsynchronousAggregation.schedule`)."""
    concurrency, buffer = shape
    return AsyncSchedule(
        config.system,
        devices,
        work,
        config.seed,
        concurrency=concurrency,
        buffer_size=buffer,
        last_version=UNBOUNDED,
        state=state,
    )


def _check_kind(config: RunConfig, algorithm: ResolvedAlgorithm, asynchronous: bool) -> None:
    """An asynchronous method needs devices to time its clients, and samples by its concurrency."""
    if not asynchronous:
        return
    name = f"algorithm.name={algorithm.name!r}"
    if not config.system.enabled:
        raise ConfigError(
            f"{name} aggregates asynchronously in virtual time, which needs the clients' devices, but "
            "system.devices='off': set system.devices to 'equal', 'lognormal' or 'trace' (docs/system.md)"
        )
    if config.engine.join_ratio < 1:
        raise ConfigError(
            f"engine.join_ratio={config.engine.join_ratio:g} has no effect with {name}, whose clients train "
            "algorithm.params.concurrency at a time: leave engine.join_ratio at 1 and set the concurrency"
        )
    if config.system.deadline_s is not None or config.system.over_commit != 1:
        raise ConfigError(
            f"system.deadline_s and system.over_commit rule synchronous rounds; {name} has none: leave them out"
        )
