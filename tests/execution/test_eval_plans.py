"""Every algorithm's evaluation plan (a declared ``shared_body``) gives what a forward per client gives.

A client half that declares a shared body (or one shared model) lets the worker evaluate all its
clients in pooled forwards; a wrong declaration (say, a subclass that evaluates personal models
but inherits its parent's plan) would report the accuracy of a model the clients do not have.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rayfed import RunConfig
from rayfed.algorithms import ALGORITHMS, ClientHalf, RoundContext
from tests.conftest import runner_and_server

_NUM_CLIENTS = 6
_OVERRIDES: dict[str, dict[str, Any]] = {  # what a method needs, or where a default would make the test slow
    "apple": {"algorithm.params": {"anneal_rounds": 2}},
    "fedlaw": {"algorithm.params": {"server_epochs": 2}},
    "fedclassavg": {"model.client_models": ["fca_alexnet"], "algorithm.params": {"warmup": False}},
    "ktpfl": {"algorithm.params": {"public_size": 60}},
}


def _one_by_one(half: ClientHalf[Any, Any]) -> ClientHalf[Any, Any]:
    """The same client half, whose shared body (where it declares one) is never there: one forward per client."""
    one_by_one = copy.copy(half)
    one_by_one.shared_body = lambda message, jobs: None  # type: ignore[attr-defined]
    return one_by_one


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_the_evaluation_plan_equals_a_forward_per_client(name: str, tmp_path: Path) -> None:
    # Prepare: one round of every client on synthetic data, as the engine runs it.
    config = RunConfig().override(
        {
            "data.dataset": "synthetic",
            "data.options": {"num_samples": 600},
            "data.num_clients": _NUM_CLIENTS,
            "algorithm.name": name,
            "engine.backend": "local",
            "train.batch_size": 16,
            **_OVERRIDES.get(name, {}),
        }
    )
    runner, server = runner_and_server(config, tmp_path)
    ids = list(range(_NUM_CLIENTS))
    ctx = RoundContext(round=0, seed=0, lr=config.train.lr, sampled=np.arange(_NUM_CLIENTS))
    trained = runner.train(server.broadcast(), ctx, ids)
    server.aggregate(ctx, trained.contribution)
    broadcast = server.broadcast()
    # Execute
    planned = runner.evaluate(broadcast, ctx, ids, trained.states)
    runner.client_half = _one_by_one(runner.client_half)
    one_by_one = runner.evaluate(broadcast, ctx, ids, trained.states)
    # Assert: the same counts and correct predictions per client, the same losses to float tolerance.
    assert [(r.num_test, r.correct, r.global_correct) for r in planned] == [
        (r.num_test, r.correct, r.global_correct) for r in one_by_one
    ]
    np.testing.assert_allclose([r.loss_sum for r in planned], [r.loss_sum for r in one_by_one], rtol=1e-4)
