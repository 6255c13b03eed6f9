"""SIGTERM is told from Ctrl-C even where a blocking call (Ray's ``ray.get``) turns it into a plain
KeyboardInterrupt."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from rayfed.engine.interrupts import exit_status, terminate_as_interrupt, was_terminated


@contextmanager
def _python_receives(signum: int) -> Iterator[None]:
    """Inside the block, ``signum`` sent to the main thread runs Python's handler there, as in a ``rayfed``
    process, whatever this one holds from earlier tests: the signal unblocked in this thread, and SIGINT's
    handler Python's default, installed again at the C level too (where a library may have replaced it without
    Python knowing); both as before after."""
    blocked = signum in signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    previous = signal.signal(signal.SIGINT, signal.default_int_handler) if signum == signal.SIGINT else None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signum})


def _blocking_call_interrupted_by(signum: int) -> KeyboardInterrupt:
    """The KeyboardInterrupt a call like ``ray.get`` raises when ``signum`` arrives while it blocks: a plain one,
    whatever the signal's handler raised. The signal goes to the main thread alone (``pthread_kill``: no other
    thread of the process can take it, as one waiting for signals would take one sent to the process)."""
    with _python_receives(signum):
        try:
            try:
                signal.pthread_kill(threading.main_thread().ident, signum)
                signal.sigtimedwait([], 0.1)  # the handler runs here at the latest
            except KeyboardInterrupt:
                raise KeyboardInterrupt from None
        except KeyboardInterrupt as plain:
            return plain
    raise AssertionError(f"signal {signum} raised nothing")


@pytest.mark.parametrize(("signum", "terminated"), [(signal.SIGTERM, True), (signal.SIGINT, False)])
def test_a_signal_is_named_by_what_was_received_not_by_the_exception_type(signum: int, terminated: bool) -> None:
    # Execute
    with terminate_as_interrupt():
        stop = _blocking_call_interrupted_by(signum)
        seen, status = was_terminated(stop), exit_status(stop)

    # Assert
    assert type(stop) is KeyboardInterrupt
    assert seen is terminated
    assert status == (143 if terminated else 130)


def test_a_later_block_starts_without_the_last_sigterm() -> None:
    with terminate_as_interrupt():
        _blocking_call_interrupted_by(signal.SIGTERM)

    with terminate_as_interrupt():
        assert not was_terminated(_blocking_call_interrupted_by(signal.SIGINT))


@pytest.mark.parametrize("left", ["SIGINT blocked in the main thread", "SIGINT ignored behind Python's back"])
def test_the_signal_reaches_python_whatever_an_earlier_test_left_in_the_process(left: str) -> None:
    """Both leave ``signal.getsignal(SIGINT)`` at Python's default, and both made a SIGINT sent with ``os.kill``
    raise nothing; the helper above sends it so that it is received all the same, and leaves what it found."""
    import ctypes

    if left.startswith("SIGINT blocked"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    else:
        ctypes.CDLL(None).signal(signal.SIGINT, 1)  # SIG_IGN, set where Python does not see it
    try:
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with terminate_as_interrupt():
            assert not was_terminated(_blocking_call_interrupted_by(signal.SIGINT))
        assert (signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())) == left.startswith("SIGINT blocked")
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.default_int_handler)
