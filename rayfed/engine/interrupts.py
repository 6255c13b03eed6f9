"""Ctrl-C and SIGTERM: a run stops at once, keeps its last completed round, and says how to continue.

A KeyboardInterrupt (Ctrl-C in the driver; with ``engine.backend="ray"`` Ray raises it
in ``ray.get``/``ray.wait`` while calls are in flight) ends a run at once while its
clients train. SIGTERM (``kill``, a batch scheduler ending a job) does the same: inside
:func:`terminate_as_interrupt` it raises :class:`Terminated`, a KeyboardInterrupt. The
rest of a round, from applying its client states and aggregate to evaluating it and
writing its metrics files (the callbacks' ``after_round``), runs inside
:func:`interrupts_deferred`: either signal there takes effect once the round is written,
so the server and client states always belong to the last recorded round. The engine
then checkpoints that round and raises :class:`RunInterrupted`; ``rayfed tune`` raises
:class:`StudyInterrupted`. Each one's message is the one line the command line prints,
before it exits with :func:`exit_status` (130 after Ctrl-C, 143 after SIGTERM).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

__all__ = [
    "RunInterrupted",
    "StudyInterrupted",
    "Terminated",
    "interrupts_deferred",
    "terminate_as_interrupt",
    "was_terminated",
    "how_stopped",
    "exit_status",
]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C is (:func:`terminate_as_interrupt`)."""


_SIGTERM_RECEIVED = threading.Event()
"""Set by SIGTERM inside :func:`terminate_as_interrupt`. A signal that arrives while Ray blocks in a call
(``ray.get``) comes out of it as a plain KeyboardInterrupt, whatever its handler raised: Ray turns the
handler's exception into a status and raises KeyboardInterrupt for it, so the type alone cannot tell."""


def was_terminated(error: BaseException) -> bool:
    """Whether ``error`` stopped a run or study because of SIGTERM rather than Ctrl-C."""
    return isinstance(error, Terminated) or bool(getattr(error, "terminated", False)) or _SIGTERM_RECEIVED.is_set()


def exit_status(error: BaseException) -> int:
    """The command line's exit status after ``error``: 128 + the signal's number, as a shell reports it."""
    return 128 + (signal.SIGTERM if was_terminated(error) else signal.SIGINT)


def how_stopped(error: BaseException) -> str:
    """``"interrupted"`` (Ctrl-C) or ``"terminated (SIGTERM)"``: how a message names what stopped the work."""
    return _stopped(was_terminated(error))


def _stopped(terminated: bool) -> str:
    return "terminated (SIGTERM)" if terminated else "interrupted"


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C or SIGTERM, after its last completed round was checkpointed."""

    def __init__(
        self, run_dir: Path, saved_round: int | None, rounds: int, command: str, *, terminated: bool = False
    ) -> None:
        self.run_dir, self.saved_round, self.rounds, self.command = run_dir, saved_round, rounds, command
        self.terminated = terminated
        if saved_round is None:
            what = "no round had finished, nothing to save"
        else:
            what = f"{saved_round + 1} of {rounds} rounds done, checkpoint of round {saved_round} saved"
        super().__init__(f"{_stopped(terminated)}: {what}; continue with: {command}")


class StudyInterrupted(KeyboardInterrupt):
    """A ``tune`` study stopped by Ctrl-C or SIGTERM; interrupted trials are retried when it resumes."""

    def __init__(self, study_name: str, finished: int, wanted: int, *, terminated: bool = False) -> None:
        self.study_name, self.finished, self.wanted = study_name, finished, wanted
        self.terminated = terminated
        super().__init__(f"study {study_name!r} {_stopped(terminated)}: {finished} of {wanted} trials finished")


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold back SIGINT and SIGTERM inside the block and deliver the first one received when the block ends.

    Only the main thread receives signals; elsewhere, or for a signal that is ignored or not
    handled by Python, the block runs unchanged.
    """
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if _in_main_thread() else {}
    held = {sig: handler for sig, handler in previous.items() if callable(handler)}
    received: list[tuple[int, FrameType | None]] = []
    for sig in held:
        signal.signal(sig, lambda signum, frame: received.append((signum, frame)))
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
        if received:
            signum, frame = received[0]
            held[signal.Signals(signum)](signum, frame)


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    _SIGTERM_RECEIVED.set()
    raise Terminated


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Inside the block, SIGTERM raises :class:`Terminated` in the main thread, as Ctrl-C raises
    KeyboardInterrupt; the previous handler (Python's default, or Ray's, which exits) comes back after it."""
    if not _in_main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not _raise_terminated:  # the outermost block: no SIGTERM yet
        _SIGTERM_RECEIVED.clear()
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
