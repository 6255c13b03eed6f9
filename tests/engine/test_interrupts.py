"""SIGTERM is told from Ctrl-C even where a blocking call (Ray's ``ray.get``) turns it into a plain
KeyboardInterrupt."""

from __future__ import annotations

import os
import signal

import pytest

from rayfed.engine.interrupts import exit_status, terminate_as_interrupt, was_terminated


def _blocking_call_interrupted_by(signum: int) -> KeyboardInterrupt:
    """The KeyboardInterrupt a call like ``ray.get`` raises when ``signum`` arrives while it blocks: a plain one,
    whatever the signal's handler raised."""
    try:
        try:
            os.kill(os.getpid(), signum)
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
