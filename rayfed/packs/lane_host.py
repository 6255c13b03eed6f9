"""A study's trials at once on Ray, packed: their runs train as lanes of one stack in one long-lived host, while
each trial is judged in the driver, round by round, as if its run trained there.

The host is one Ray actor (:class:`~rayfed.actors.pack_host.HostActor`) with one worker's resources, as a pack of
:func:`rayfed.run_many` is one Ray task: :class:`LaneHost` runs each trial's run in a thread of its own (one of
the actor's), their stacks merged by one :class:`~rayfed.execution.stack_merger.StackMerger`, and trains its
clients there (:func:`~rayfed.execution.stack_merger.training_backend`). What talks to the study stays in the
driver: Optuna's storage (the pruner's ``trial.report`` and ``should_prune``) and the study's stop (Ctrl-C,
SIGTERM). So the last callback of a hosted run (:class:`_Relay`) hands each round's record to the driver and waits
for its verdict: :data:`GO` on, :data:`PRUNE` (the run ends early, as a pruned trial's does), or :data:`STOP` (the
run ends as Ctrl-C ends it: its round checkpointed, the trial retried on resume). The driver's thread of that
trial asks for the rounds one by one (:func:`run_as_lane`). A run's other callbacks (its metrics files,
checkpoints, trackers) run in the host, in the run's directory: the host's node needs the driver's working
directory and the study's directory at the same paths, as a pack's host does (:mod:`rayfed.actors.pack_host`).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import cloudpickle
import pyarrow as pa

from rayfed.config import EngineConfig, RunConfig
from rayfed.engine import RunResult, run
from rayfed.engine.callbacks import Callback, RunView
from rayfed.engine.metrics import RoundRecord
from rayfed.execution.stack_merger import StackMerger
from rayfed.packs.pack_threads import missing_folder, portable
from rayfed.util.plugins import WithCode

if TYPE_CHECKING:  # pragma: no cover
    from rayfed.actors.pack_host import HostActor

logger = logging.getLogger(__name__)

__all__ = ["GO", "PRUNE", "STOP", "LaneHost", "lane_host", "run_as_lane"]

GO, PRUNE, STOP = "go", "prune", "stop"
"""The driver's verdicts on a hosted run's round."""


class _Mailbox:
    """One hosted run's rounds, to the driver, and the driver's verdicts, back (None: the run has ended)."""

    def __init__(self) -> None:
        self.rounds: queue.Queue[RoundRecord | None] = queue.Queue()
        self.verdicts: queue.Queue[str] = queue.Queue()


class _Relay(Callback):
    """A hosted run's last callback: each round waits for the driver's verdict on it."""

    def __init__(self, mailbox: _Mailbox) -> None:
        self.mailbox = mailbox

    def after_round(self, run: RunView, record: RoundRecord, clients: pa.Table) -> bool:
        self.mailbox.rounds.put(record)
        verdict = self.mailbox.verdicts.get()
        if verdict == STOP:  # as Ctrl-C in the run's thread: the run checkpoints this round and ends
            raise KeyboardInterrupt
        return verdict == PRUNE


class LaneHost:
    """The host's side: runs by key (a trial's number), each in the calling thread, their stacks merged; in the
    driver's working directory ``cwd``."""

    def __init__(self, cwd: str) -> None:
        self._missing = missing_folder(cwd)
        if self._missing is None:
            os.chdir(cwd)  # the host's process, whose threads are all the study's runs
        self._merger = StackMerger()
        self._mailboxes: dict[str, _Mailbox] = {}
        self._lock = threading.Lock()

    def _mailbox(self, key: str) -> _Mailbox:
        with self._lock:
            return self._mailboxes.setdefault(key, _Mailbox())

    def run(self, key: str, shipped: bytes) -> RunResult | BaseException:
        """Run the config and callbacks ``shipped`` (:func:`run_as_lane`) as a lane of the host's stack; its result,
        or its error (unpickling them included: the driver waits for the run's end) as one the driver can
        unpickle."""
        mailbox = self._mailbox(key)
        try:
            if self._missing is not None:
                return self._missing
            with_code, callbacks = cloudpickle.loads(shipped)
            self._merger.expect(1)
            with self._merger.turn():
                return run(with_code.config, callbacks=[*callbacks, _Relay(mailbox)])
        except BaseException as error:  # noqa: BLE001 - the driver raises it, in the trial's thread
            return portable(error) or error
        finally:
            mailbox.rounds.put(None)

    def next_round(self, key: str) -> RoundRecord | None:
        """The next round of run ``key``, once it has trained it; None once the run has ended."""
        record = self._mailbox(key).rounds.get()
        if record is None:
            with self._lock:
                del self._mailboxes[key]
        return record

    def answer(self, key: str, verdict: str) -> None:
        """The driver's verdict on the round of run ``key`` it was last handed."""
        self._mailbox(key).verdicts.put(verdict)

    def merged(self) -> int:
        """Stacks trained with another run's (:attr:`StackMerger.merged`)."""
        return self._merger.merged


@contextmanager
def lane_host(engine: EngineConfig, lanes: int) -> Iterator[HostActor]:
    """A :class:`LaneHost` for ``lanes`` runs at once, on the Ray this driver joined, with one worker's resources of
    ``engine`` (refused before it is asked for where the cluster has no room for it); ended on leaving, the log
    saying how often its runs' stacks merged."""
    from rayfed.actors import check_resources
    from rayfed.actors.pack_host import HostActor, one_worker

    check_resources(one_worker(engine))
    host = HostActor(engine, LaneHost, os.getcwd(), concurrency=2 * lanes + 2)  # each run, its driver's asks
    try:
        yield host
    finally:
        try:
            logger.info("tune: the trials' runs trained %d stacks merged with another's", host.call("merged"))
        except Exception:  # noqa: BLE001 - a host that died says no more; its trials' errors say why
            pass
        host.close()


def run_as_lane(
    host: HostActor,
    key: str,
    config: RunConfig,
    callbacks: Sequence[Callback],
    verdict: Callable[[RoundRecord], str],
) -> RunResult:
    """``run(config, callbacks=callbacks)`` in ``host`` under ``key``, each of its rounds judged here by
    ``verdict`` (:data:`GO`, :data:`PRUNE`, :data:`STOP`); returns its result or raises its error (a verdict's own
    error stops the run first)."""
    result = host.start("run", key, cloudpickle.dumps((WithCode(config), list(callbacks))))
    failed: Exception | None = None
    while (record := host.call("next_round", key)) is not None:
        try:
            answer = verdict(record)
        except Exception as error:  # noqa: BLE001 - raised once the run has stopped
            failed, answer = error, STOP
        host.call("answer", key, answer)
    value = result()
    if failed is not None:
        raise failed
    if isinstance(value, BaseException):
        raise value
    return value
