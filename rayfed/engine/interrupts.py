"""Ctrl-C: a run stops at once, keeps its last completed round, and says how to continue.

A KeyboardInterrupt (Ctrl-C in the driver; with ``engine.backend="ray"`` Ray raises it
in ``ray.get``/``ray.wait`` while calls are in flight) ends a run at once while its
clients train. The rest of a round, from applying its client states and aggregate to
evaluating it and writing its metrics files (the callbacks' ``after_round``), runs
inside :func:`interrupts_deferred`: an interrupt there takes effect once the round is
written, so the server and client states always belong to the last recorded round.
The engine then checkpoints that round and raises :class:`RunInterrupted`;
``rayfed tune`` raises :class:`StudyInterrupted`. Each one's message is the one line
the command line prints.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

__all__ = ["RunInterrupted", "StudyInterrupted", "interrupts_deferred"]


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C, after its last completed round was checkpointed."""

    def __init__(self, run_dir: Path, saved_round: int | None, rounds: int, command: str) -> None:
        self.run_dir, self.saved_round, self.rounds, self.command = run_dir, saved_round, rounds, command
        if saved_round is None:
            what = "no round had finished, nothing to save"
        else:
            what = f"{saved_round + 1} of {rounds} rounds done, checkpoint of round {saved_round} saved"
        super().__init__(f"interrupted: {what}; continue with: {command}")


class StudyInterrupted(KeyboardInterrupt):
    """A ``tune`` study stopped by Ctrl-C; interrupted trials are retried when it resumes."""

    def __init__(self, study_name: str, finished: int, wanted: int) -> None:
        self.study_name, self.finished, self.wanted = study_name, finished, wanted
        super().__init__(f"study {study_name!r} interrupted: {finished} of {wanted} trials finished")


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold back SIGINT inside the block and deliver it (once) when the block ends.

    Only the main thread receives signals; elsewhere, or when SIGINT is ignored or not
    handled by Python, the block runs unchanged.
    """
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if not callable(previous):
        yield
        return
    received: list[FrameType | None] = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            previous(signal.SIGINT, received[0])
