"""Shared fixtures: tiny configs on the offline synthetic dataset (generated once per process for each set of
options), one Ray cluster per session, and the suite's two lanes (:mod:`tests.lanes`)."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import torch

from tests.cached_synthetic import cache_synthetic
from tests.lanes import hypothesis_profile, pytest_collection_modifyitems  # noqa: F401  (marks each test's lane)

T = TypeVar("T")

pytest_plugins = ("pytester",)  # tests/test_lanes.py collects example tests

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# `rayfed list` caches its catalogue under $XDG_CACHE_HOME; the tests' registrations (e.g. the
# two-group dataset) must never reach the user's cache.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="rayfed-test-cache-")
# Checkpoints are sealed with a key kept outside run directories (rayfed.provenance.checkpoint_key): the tests' own,
# made on first use, so that they never make or read the user's.
os.environ["RAYFED_CHECKPOINT_KEY_FILE"] = str(Path(tempfile.mkdtemp(prefix="rayfed-test-key-")) / "checkpoint.key")
# Ctrl-C as a terminal's foreground process receives it. A shell starts a background job (`.ci/run &`, `nohup`)
# with SIGINT ignored; Python then installs no handler, and every process it starts ignores SIGINT too, so the
# tests that interrupt rayfed with it (tests/engine/test_interrupts.py, the Ctrl-C tests of tests/tuning) would
# see nothing arrive. A handled signal is reset to its default in the processes started from here (xdist's
# workers, `python -m rayfed`), where Python installs its own handler again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# One torch thread, as a run's workers have (engine.torch_threads), whatever ran before in this process: two
# pytest-xdist workers on two cores would otherwise wait on each other's OpenMP barriers.
torch.set_num_threads(1)

cache_synthetic()


def pytest_configure(config: pytest.Config) -> None:
    """Hypothesis's budget by lane (:func:`tests.lanes.hypothesis_profile`)."""
    hypothesis_profile(config)


TINY_SAMPLES = 1200
"""A tiny run's synthetic samples: 120 a client, 9 local steps of 10 (its 30 test samples evaluate it)."""


def tiny_overrides(run_dir: Path, **extra: object) -> dict[str, object]:
    """A run that takes seconds: 10 clients on 1,200 synthetic samples, 2 rounds, in-process."""
    base: dict[str, object] = {
        "data.dataset": "synthetic",
        "data.options": {"num_samples": TINY_SAMPLES},
        "data.num_clients": 10,
        "data.partition": "pathological",
        "data.classes_per_client": 2,
        "train.rounds": 2,
        "engine.backend": "local",
        "engine.progress": False,
        "run_dir": str(run_dir),
    }
    base.update(extra)
    return base


@pytest.fixture(scope="session")
def ray_cluster():
    """A private local Ray for the whole test session, ended with ray.shutdown()
    (the CLI stop command would end every Ray on the machine)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def python_calls(work: Callable[[], T]) -> tuple[int, T]:
    """The Python calls (functions and builtins, nested ones included) that ``work()`` makes, and its result:
    a count that tells a vectorised step from a Python loop over clients or samples, whatever the box's load."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        result = work()
    finally:
        sys.setprofile(None)
    return calls, result


def train_phases(job, phases, *, mean=(0.5,), std=(0.5,), output_layers=None):
    """Train ``job`` through ``phases`` with the one loop, from the model in ``job.flat``, as a worker trains a
    client alone (the phases checked first, as a worker checks them); returns its mean reported loss and its
    steps. ``output_layers`` (architecture -> output layer) lets the loop train a phase on the output layer alone
    on features computed once, as a worker's loop does."""
    import torch

    from rayfed.train.graphs import StepGraphs
    from rayfed.train.loop import LocalLoop
    from rayfed.train.phase_checks import PhaseContext, check_phases

    checked = check_phases(phases, PhaseContext("test", "phases", job.client_id, job.flat, keeps_state=True))
    loop = LocalLoop(StepGraphs(torch.device("cpu"), enabled=False), mean, std, output_layers)
    return loop.train_one(job, checked)


def train_client(half, message, job, *, mean=(0.5,), std=(0.5,), output_layers=None):
    """Start ``job`` as a worker does (``job.start`` = ``half.start(message, job)``, its model loaded into
    ``job.flat``), then train it through ``half.phases(message, job)``, as :func:`train_phases`."""
    job.start = half.start(message, job)
    job.flat.load_state(job.start.model)
    phases = half.phases(message, job)
    return train_phases(job, phases, mean=mean, std=std, output_layers=output_layers)


def client_job(
    flat,
    x,
    y,
    *,
    train=None,
    test=None,
    architecture="tiny",
    client_id=0,
    round=0,
    generator=0,
    num_classes=0,
    state=None,
):
    """Client ``client_id``'s job of round ``round``: it trains on ``(x, y)`` with ``train`` (a TrainConfig, by
    default the run defaults) and its learning rate, and tests on ``test`` (by default the same samples); its
    label counts are those of ``y`` over ``num_classes`` classes; ``generator`` is its batch generator or the
    seed of one."""
    import numpy as np
    import torch

    from rayfed.train.job import ClientJob
    from rayfed.train.settings import TrainConfig

    settings = train or TrainConfig()
    x_test, y_test = (x, y) if test is None else test
    counts = np.bincount(y.cpu().numpy(), minlength=num_classes)
    return ClientJob(
        client_id=client_id,
        round=round,
        worker_model=flat,
        architecture=architecture,
        x_train=x,
        y_train=y,
        x_test=x_test,
        y_test=y_test,
        label_counts=counts,
        train_label_counts=counts,
        train=settings,
        lr=settings.lr,
        generator=generator if isinstance(generator, torch.Generator) else torch.Generator().manual_seed(generator),
        state=state,
    )


def runner_and_server(config, run_dir):
    """The plain worker and server of ``config``'s run, its inputs prepared into ``run_dir``: one round's halves
    as the engine builds them, without the engine."""
    from rayfed.algorithms import resolve
    from rayfed.engine.inputs import RunInputs
    from rayfed.execution.client_runner import ClientRunner
    from rayfed.execution.server import Server

    inputs = RunInputs.prepare(config, resolve(config.algorithm), run_dir, continues=False)
    runner = ClientRunner(config, inputs.spec.for_clients(), inputs.dataset, inputs.partition)
    return runner, Server(config, inputs.spec, inputs.initial)
