"""The run's system model, made and checked before anything is written: :func:`plan_rounds`.

From the ``system`` section (docs/system.md) it loads every client's device (:func:`~rayfed.system.load_profiles`:
presets or trace files, a bad one refused in one line), works out each client's round (:func:`run_workload`) and
builds what the round loop asks each round (:mod:`rayfed.engine.rounds`): synchronous rounds in virtual time, whose
deadline must be one some device meets, or, for an asynchronous method, its schedule, whose buffer must fit its
concurrency and whose concurrency the clients online.
"""

from __future__ import annotations

import numpy as np

from rayfed.algorithms import ResolvedAlgorithm
from rayfed.algorithms.common.asynchronous import AsynchronousParams
from rayfed.algorithms.sizing import architecture_state_bytes
from rayfed.config import RunConfig
from rayfed.engine.asynchronous import UNBOUNDED, AsyncRounds
from rayfed.engine.inputs import RunInputs
from rayfed.engine.rounds import Rounds, VirtualRounds
from rayfed.system import AsyncSchedule, AsyncState, DeviceProfiles, SyncRounds, Workload, load_profiles
from rayfed.system.limits import check_clock
from rayfed.train.batches import steps_per_epoch
from rayfed.util.errors import ConfigError

__all__ = ["plan_rounds", "run_workload", "is_asynchronous"]


def is_asynchronous(algorithm: ResolvedAlgorithm) -> bool:
    """Whether the run's method aggregates asynchronously (its params are ``AsynchronousParams``)."""
    return isinstance(algorithm.server_params, AsynchronousParams)


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
    work = run_workload(config, inputs)
    check_clock(system, devices, work, config.train.rounds)
    if not asynchronous:
        return VirtualRounds(config, SyncRounds(system, devices, work, config.seed, config.engine.join_ratio))
    params: AsynchronousParams = algorithm.server_params
    return AsyncRounds(config, lambda state: _schedule(config, params, devices, work, state))


def _schedule(
    config: RunConfig, params: AsynchronousParams, devices: DeviceProfiles, work: Workload, state: AsyncState | None
) -> AsyncSchedule:
    return AsyncSchedule(
        config.system,
        devices,
        work,
        config.seed,
        concurrency=params.concurrency,
        buffer_size=params.buffer,
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


def run_workload(config: RunConfig, inputs: RunInputs) -> Workload:
    """Each client's round: ``train.local_epochs`` epochs of its training split's mini-batches, one model down and
    one model up (its architecture's state, parameters then buffers, in float32: what the FedAvg family sends)."""
    train, spec = config.train, inputs.spec
    sizes = np.asarray(inputs.partition.num_train(), dtype=np.int64)
    steps = steps_per_epoch(sizes, train.batch_size, train.drop_last) * train.local_epochs
    if not spec.client_architectures:
        size = float(architecture_state_bytes(spec, spec.default_architecture))
        return Workload(steps, size, size)
    cycle = np.array([architecture_state_bytes(spec, arch) for arch in spec.client_architectures], dtype=np.float64)
    each = cycle[np.arange(config.data.num_clients) % len(cycle)]  # ProblemSpec.architecture_of, for every client
    return Workload(steps, each, each)
