"""Every algorithm states the client state it really keeps (``StateSizes.client_state_bytes``).

The engine refuses, before anything is written, a run whose clients' states fit neither memory nor
disk (:func:`rayfed.engine.sizing.check_client_states`); an estimate above what the clients keep
refuses runs that fit (cwFedAvg keeps no model per client, only BatchNorm buffers), one below lets
through runs that do not. For each registered algorithm, two rounds of every client on synthetic
data, as the engine runs them, fill a client state store; the estimate must be at least what it
holds and at most half as much again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rayfed import RunConfig
from rayfed.algorithms import ALGORITHMS, RoundContext
from rayfed.engine.sizing import client_states_bytes
from rayfed.engine.state_store import ClientStateStore
from tests.conftest import runner_and_server

_NUM_CLIENTS = 6
_OVERRIDES: dict[str, dict[str, Any]] = {  # what a method needs, or where a default would make the test slow
    "apple": {"algorithm.params": {"anneal_rounds": 2}},
    "fedlaw": {"algorithm.params": {"server_epochs": 2}},
    "fedclassavg": {
        "model.client_models": ["fca_alexnet"],
        "algorithm.params": {"warmup": False},
        "data.options": {"num_samples": 200},
    },
    "ktpfl": {"algorithm.params": {"public_size": 60}},
}
_CASES = [pytest.param(name, {}, id=name) for name in sorted(ALGORITHMS)] + [
    # the states that exist only with momentum, or with BatchNorm buffers
    *(pytest.param(name, {"train.momentum": 0.9}, id=f"{name}-momentum") for name in ("sgdm", "fedawa", "feddyn")),
    pytest.param("cwfedavg", {"model.name": "resnet20"}, id="cwfedavg-batchnorm"),
]


@pytest.mark.parametrize(("name", "extra"), _CASES)
def test_the_client_state_estimate_covers_what_the_store_holds(name: str, extra: dict[str, Any], tmp_path: Path):
    # Prepare: two rounds of every client, as the engine runs them, their states kept in a store.
    config = RunConfig().override(
        {
            "data.dataset": "synthetic",
            "data.options": {"num_samples": 600},
            "data.num_clients": _NUM_CLIENTS,
            "algorithm.name": name,
            "engine.backend": "local",
            "train.batch_size": 16,
            **_OVERRIDES.get(name, {}),
            **extra,
        }
    )
    runner, server = runner_and_server(config, tmp_path)
    store = ClientStateStore(tmp_path / "spill", memory_bytes=2**40)
    ids = list(range(_NUM_CLIENTS))
    # Execute
    for t in range(2):
        ctx = RoundContext(round=t, seed=0, lr=config.train.lr, sampled=np.arange(_NUM_CLIENTS))
        trained = runner.train(server.broadcast(), ctx, ids, store.get_many(ids))
        for cid, state in trained.states.items():
            store.put(cid, state)
        server.aggregate(ctx, trained.contribution)
    # Assert
    _, estimate = client_states_bytes(config)
    held = store.bytes_in_memory
    assert held <= estimate <= 1.5 * held or estimate == held, (estimate, held)
