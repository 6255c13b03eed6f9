"""Parallel trials: how they share one Ray cluster, and how Ctrl-C reaches them.

Every trial's run creates its own ``ClientWorker`` pool. With ``engine.num_workers=0`` ("as many as the
cluster holds") and K trials at once, each trial runs on an even share of the workers the cluster holds:
``engine.num_workers = workers // K`` (at least one each; a cluster too small for K trials is refused). A set
``engine.num_workers`` is kept, and K trials of it must fit at once: half-built pools of several trials
would wait on each other forever. A trial's numbers do not depend on its workers (the batching of its clients
does not), so sharing changes when a trial ends, not what it finds.

Trials run in threads, and Ctrl-C (or SIGTERM) reaches only the main thread, where Optuna waits for them.
There :func:`stopping_parallel_trials` turns the signal into a :class:`TrialStop` request instead of an
exception: each running trial ends after its current round (its run checkpointed, the trial marked
interrupted, so that the study's resume retries it), no trial starts after it, and Optuna's loop ends as
the trials do, every one of them finished before the study's Ray is shut down. A second Ctrl-C says again
what the study waits for; it cannot tear down a round half-way, which is what left trials failed before.

The threads take their trials one at a time (:class:`OneClaimAtATime`): Optuna claims a waiting trial (a retry
the resume re-enqueued) by reading its state and writing it, which an SQLite storage does not hold apart, so two
threads could claim the same retry and run it twice in one run directory.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import optuna

from rayfed.config import EngineConfig
from rayfed.engine.interrupts import Terminated, how_stopped
from rayfed.util.errors import ResourceError

logger = logging.getLogger(__name__)

__all__ = [
    "trial_workers",
    "check_cluster_fits",
    "TrialStop",
    "stops_recorded",
    "stopping_parallel_trials",
    "OneClaimAtATime",
]


def trial_workers(engine: EngineConfig, parallel_trials: int) -> dict[str, int]:
    """The override of each trial's run: its share of the cluster's workers when ``engine.num_workers`` is 0 and
    trials run in parallel, else none. Needs Ray initialised; raises ResourceError when the cluster holds fewer
    workers than ``parallel_trials``."""
    if parallel_trials == 1 or engine.num_workers > 0:
        return {}
    from rayfed.actors.cluster import cluster_nodes, workers_on  # Ray: only a study on Ray gets here

    held = engine.workers_for(workers_on(cluster_nodes(), engine))
    share = held // parallel_trials
    if share < 1:
        raise ResourceError(
            f"parallel_trials={parallel_trials} trials at once need a worker each, but the Ray cluster holds "
            f"{held} (engine.num_cpus_per_worker={engine.num_cpus_per_worker:g}, engine.num_gpus_per_worker="
            f"{engine.num_gpus_per_worker:g}); run at most {max(held, 1)} trials at once (--parallel) or lower the "
            "per-worker resources"
        )
    logger.info(
        "%d trials at once share the Ray cluster's %d workers: engine.num_workers=%d each", parallel_trials, held, share
    )
    return {"engine.num_workers": share}


def check_cluster_fits(engine: EngineConfig, parallel_trials: int) -> None:
    """Parallel trials must all fit at once: half-created worker pools would wait on each other forever."""
    if parallel_trials == 1:
        return
    import ray

    total = ray.cluster_resources()
    for resource, per_worker in (("CPU", engine.num_cpus_per_worker), ("GPU", engine.num_gpus_per_worker)):
        need = parallel_trials * engine.num_workers * per_worker
        if need > float(total.get(resource, 0.0)):
            raise ResourceError(
                f"parallel_trials={parallel_trials} x engine.num_workers={engine.num_workers} x "
                f"{per_worker:g} {resource} per worker needs {need:g} {resource}s, but the Ray cluster has "
                f"{float(total.get(resource, 0.0)):g}; lower parallel_trials or engine.num_workers"
            )


class TrialStop:
    """A request that the study stop: Ctrl-C or SIGTERM, recorded from before its first trial
    (:func:`stops_recorded`); with trials in threads, the signal's only effect (:func:`stopping_parallel_trials`),
    and every running trial stops after its current round."""

    def __init__(self) -> None:
        self._requested = threading.Event()
        self.terminated = False
        """Whether SIGTERM asked (the command line then exits with 143, as after a run's SIGTERM)."""

    def request(self, *, terminated: bool) -> None:
        self.terminated = self.terminated or terminated
        self._requested.set()

    def is_set(self) -> bool:
        return self._requested.is_set()

    def interruption(self) -> KeyboardInterrupt:
        """What a stopped trial raises: :class:`~rayfed.engine.interrupts.Terminated` after SIGTERM, else a
        KeyboardInterrupt, as the signal would have in the main thread."""
        return Terminated() if self.terminated else KeyboardInterrupt()


@contextmanager
def stops_recorded() -> Iterator[TrialStop]:
    """For a whole study, from before its first trial: Ctrl-C and SIGTERM request the stop it yields, then act as
    they did (Python's KeyboardInterrupt, :func:`~rayfed.engine.interrupts.terminate_as_interrupt`'s Terminated). An
    interruption that lands where Python drops it (in a ``__del__`` or a weakref callback run while the study
    starts) is then not lost: the request ends the study when its next trial starts or its running trial's round
    ends. A signal that is ignored, or left to the system, stays so; off the main thread nothing changes."""
    stop = TrialStop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    taken = {sig: handler for sig, handler in previous.items() if callable(handler)}
    if threading.current_thread() is not threading.main_thread():
        taken = {}

    def record(signum: int, frame: FrameType | None) -> None:
        stop.request(terminated=signum == signal.SIGTERM)
        taken[signal.Signals(signum)](signum, frame)

    for sig in taken:
        signal.signal(sig, record)
    try:
        yield stop
    finally:
        for sig, handler in taken.items():
            signal.signal(sig, handler)


@contextmanager
def stopping_parallel_trials(stop: TrialStop, parallel_trials: int) -> Iterator[None]:
    """With trials in threads, make Ctrl-C and SIGTERM request ``stop`` (and say so on stderr) instead of raising
    in the main thread, where Optuna waits for the trials: each then ends after its current round, and Optuna's
    loop with them. A signal that is ignored, or left to the system (SIGTERM outside ``rayfed``), stays so."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    taken = {sig: handler for sig, handler in previous.items() if callable(handler)}
    if parallel_trials == 1 or threading.current_thread() is not threading.main_thread() or not taken:
        yield
        return

    def request(signum: int, frame: FrameType | None) -> None:
        again = stop.is_set()
        stop.request(terminated=signum == signal.SIGTERM)
        print(
            f"{how_stopped(stop.interruption())}: {'still ' if again else ''}waiting for the running trials to end "
            "their current round; each is retried when the study resumes",
            file=sys.stderr,
            flush=True,
        )

    for sig in taken:
        signal.signal(sig, request)
    try:
        yield
    finally:
        for sig, handler in taken.items():
            signal.signal(sig, handler)


class OneClaimAtATime(optuna.Study):
    """A study whose trial threads ask for their next trial one at a time, so that each waiting trial is claimed
    by one thread only (the module's docstring says why)."""

    _claiming = threading.Lock()

    def ask(self, fixed_distributions: dict[str, Any] | None = None) -> optuna.Trial:
        with self._claiming:
            return super().ask(fixed_distributions)
