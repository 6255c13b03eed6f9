"""Local-only training: own models kept in the state store, nothing uploaded or aggregated."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from rayfed import RunConfig
from rayfed.engine import Simulation
from tests.algorithms.client_states import StateSnapshots
from tests.conftest import tiny_overrides


def test_local_clients_keep_their_own_models_and_send_nothing(tmp_path) -> None:
    # Prepare: 4 clients, half sampled per round.
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "algorithm.name": "local",
                "data.num_clients": 4,
                "data.partition": "dirichlet",
                "data.options": {"num_samples": 600},
                "engine.join_ratio": 0.5,
                "train.rounds": 2,
            },
        )
    )
    states = StateSnapshots()
    # Execute
    Simulation(config, callbacks=[states]).run()
    # Assert: no bytes either way; every client is evaluated; trained models persist and
    # clients that sat out a round keep theirs unchanged.
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    sampled = [c for c in clients if c["sampled"]]
    assert len(sampled) == 4 and all(c["bytes_up"] == 0 and c["bytes_down"] == 0 for c in sampled)
    assert len([c for c in clients if c["round"] == 1]) == 4
    first, second = states.rounds
    trained_again = {c["client_id"] for c in sampled if c["round"] == 1}
    for cid, model in first.items():
        if cid in trained_again:
            assert not np.array_equal(second[cid], model)
        else:
            np.testing.assert_array_equal(second[cid], model)
    # Own initialisations: two clients' first models differ even where training barely moved them.
    ids = sorted(second)
    assert not np.array_equal(second[ids[0]], second[ids[1]])
