"""A client half lent to another server half (``algorithm.client``) trains its phases there, or is refused in one
line that names it; it never ends in a bare error from deep inside the method.

Every registered method's client half is lent to FedAvg's server (which sends a plain global model): those whose
phases read nothing of their own message (FedProx's proximal term, Ditto's personal model, FedNH's cosine
classifier on the starting output weight) train; the others say what they lack.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rayfed import RunConfig
from rayfed.algorithms import ALGORITHMS, RoundContext, resolve
from rayfed.algorithms.borrowed import BorrowedTraining
from rayfed.util.errors import MethodError, RayfedError
from tests.algorithms.body_head_cases import tiny_problem
from tests.conftest import runner_and_server

TRAINS_LENT = {"fedprox", "sgdm", "ditto", "feduv", "fednh", "fedavg", "fedrep", "fedbabu", "local"}
"""Client halves whose phases read no message of their own algorithm (a few more may: every one is run)."""


@pytest.mark.parametrize("lent", sorted(ALGORITHMS))
def test_a_client_half_lent_to_fedavg_trains_or_is_refused_naming_it(lent: str, tmp_path: Path) -> None:
    try:
        config = RunConfig().override(
            {
                "data.options": {"num_samples": 240},
                "data.num_clients": 4,
                "algorithm.name": "fedavg",
                "algorithm.client": lent,
                "engine.backend": "local",
                "train.batch_size": 8,
            }
        )
        runner, server = runner_and_server(config, tmp_path)
        ctx = RoundContext(round=0, seed=0, lr=config.train.lr, sampled=np.arange(4))
        result = runner.train(server.broadcast(), ctx, [0, 1, 2, 3])
    except RayfedError as error:  # refused: in one line, naming the lent client half
        assert lent not in TRAINS_LENT, f"{lent}'s phases should train under FedAvg: {error}"
        assert "\n" not in str(error) and repr(lent) in str(error), str(error)
        return
    assert all(math.isfinite(report.train_loss) and report.steps > 0 for report in result.reports)


def test_a_lent_method_that_reads_what_the_run_lacks_is_refused_and_its_own_errors_are_raised_as_they_are() -> None:
    # Prepare: FedProx's phases lent to FedAvg, replaced by broken ones.
    _, spec = tiny_problem()
    config = RunConfig().override({"algorithm.name": "fedavg", "algorithm.client": "fedprox"})
    half = resolve(config.algorithm).make_client(spec)
    assert isinstance(half, BorrowedTraining)
    message, job = SimpleNamespace(vector=None), SimpleNamespace(start=SimpleNamespace())

    def reads_the_message(message: Any, job: Any) -> Any:
        return message.anchor

    def reads_the_start(message: Any, job: Any) -> Any:
        return job.start.cores

    def reads_the_job(message: Any, job: Any) -> Any:
        return job.personal_model

    # Execute, assert: a field the run's message or start lacks is refused naming both halves; any other
    # AttributeError is the lent method's own, raised as it is.
    refused = "'fedprox' lends its phases to algorithm.name='fedavg', but they read"
    half.training.phases = reads_the_message  # type: ignore[method-assign]
    with pytest.raises(MethodError, match=f"{refused} a message 'fedavg' does not send .*'anchor'"):
        half.phases(message, job)
    half.training.phases = reads_the_start  # type: ignore[method-assign]
    with pytest.raises(MethodError, match=rf"{refused} a start \(job.start\) the client half of 'fedavg' .*'cores'"):
        half.phases(message, job)
    half.training.phases = reads_the_job  # type: ignore[method-assign]
    with pytest.raises(AttributeError, match="personal_model") as raised:
        half.phases(message, job)
    assert not isinstance(raised.value, MethodError)
