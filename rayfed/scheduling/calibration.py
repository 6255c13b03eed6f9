"""``system.calibrate``: the reference device's seconds per local step, measured on the run's own model.

Virtual time counts a client's local steps in the reference device's seconds, ``system.step_s`` (docs/system.md).
With ``system.calibrate`` the plan measures it before the run, on this machine: one client (the one with the most
training samples) trains its round with the run's own method, model, data and batch size, on the device a worker of
this run trains on, a few times after a first warm-up round; ``step_s`` is the median round's seconds over its steps
(of all its phases, reported or not). The measured value then stands as ``system.step_s`` in the run's
``config.json`` (and its identity), and a continued run takes it from there rather than measuring again: a run's
numbers never depend on the machine it resumes on.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from rayfed.algorithms import ResolvedAlgorithm
from rayfed.config import RunConfig, read_run_config
from rayfed.engine.inputs import RunInputs
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.round_facts import RoundFacts
from rayfed.util.errors import ConfigError

__all__ = ["with_recorded_step_s", "with_measured_step_s", "measure_step_s"]

logger = logging.getLogger(__name__)

_TIMED_ROUNDS = 3
_CONFIG_FILE = "config.json"


def with_recorded_step_s(config: RunConfig, run_dir: Path) -> RunConfig:
    """``config`` with the ``system.step_s`` its run measured when it began, if it calibrates and ``run_dir``
    records one (a continued run); else ``config`` itself."""
    saved = run_dir / _CONFIG_FILE
    if not config.system.calibrate or not saved.exists():
        return config
    recorded = read_run_config(saved).system
    if not recorded.calibrate:
        return config  # another run's directory: check_run_dir says so
    return replace(config, system=replace(config.system, step_s=recorded.step_s))


def with_measured_step_s(config: RunConfig, algorithm: ResolvedAlgorithm, inputs: RunInputs) -> RunConfig:
    """``config`` with ``system.step_s`` measured (:func:`measure_step_s`) when it calibrates; else itself."""
    if not config.system.calibrate:
        return config
    step_s = measure_step_s(config, algorithm, inputs)
    logger.info("system.calibrate: a local step takes %.4g s on this machine; system.step_s=%.4g", step_s, step_s)
    return replace(config, system=replace(config.system, step_s=step_s))


def measure_step_s(config: RunConfig, algorithm: ResolvedAlgorithm, inputs: RunInputs) -> float:
    """The median seconds per local step of the client with the most training samples, over a few rounds of its
    training on this process's worker device, after one round that builds the models (module docstring)."""
    client = int(np.argmax(inputs.partition.num_train()))
    runner = ClientRunner(config, inputs.spec, inputs.dataset, inputs.partition)
    message = algorithm.make_server(inputs.spec, inputs.initial).broadcast()
    ctx = RoundFacts(round=0, seed=config.seed, lr=config.train.lr_at(0), sampled=np.array([client]))
    runner.train(message, ctx, [client])  # warm-up: the model built, its steps captured where they replay
    seconds, steps = [], 0
    for _ in range(_TIMED_ROUNDS):
        started = time.perf_counter()
        steps = runner.train(message, ctx, [client]).reports[0].trained_steps  # every phase's
        seconds.append(time.perf_counter() - started)
    if steps == 0:
        raise ConfigError(
            f"system.calibrate=true measures a local step, but client {client}, the one with the most training "
            "samples, takes none (too few samples for one mini-batch: see train.batch_size and train.drop_last); "
            "set system.step_s instead"
        )
    return statistics.median(seconds) / steps
