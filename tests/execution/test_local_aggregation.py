"""Local aggregation: the server receives one summed contribution per worker call, never one per client.

For FedAvg a worker call uploads Σ n_i θ_i and Σ n_i whatever the number of clients in
it; for cwFedAvg the K x P class-wise sums, the FedAvg part and, per client, only its
row p̃_i (and row norms): K floats each, which the server has to store anyway. Between
rounds nothing per client is kept beyond the server's M x K rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from rayfed import RunConfig, Simulation, run
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.server import Server
from tests.conftest import tiny_overrides

CALLS = 2
MODEL_FLOATS = 582_026  # cnn4 on 1x28x28, 10 classes


def _config(tmp_path, algorithm: str, clients: int, **extra: object) -> RunConfig:
    return RunConfig().override(
        tiny_overrides(
            tmp_path / f"{algorithm}-{clients}",
            **{
                "algorithm.name": algorithm,
                "data.num_clients": clients,
                "data.options": {"num_samples": 15 * clients},
                "data.partition": "iid",
                "data.train_fraction": 2 / 3,  # 10 training samples: one step of batch 10 per client
                "engine.clients_per_call": clients // CALLS,
                "train.rounds": 1,
                **extra,
            },
        )
    )


@pytest.fixture
def received(monkeypatch) -> list[list[tuple[int, int]]]:
    """(clients summed, bytes) of every part the server aggregates, one list per round."""
    rounds: list[list[tuple[int, int]]] = []
    original = Server.aggregate

    def spy(self, ctx, *parts):
        rounds.append([(part.count, part.nbytes) for part in parts])
        return original(self, ctx, *parts)

    monkeypatch.setattr(Server, "aggregate", spy)
    return rounds


@pytest.mark.parametrize("algorithm", ["fedavg", "cwfedavg"])
def test_server_receives_one_contribution_per_worker_call(tmp_path, received, algorithm: str) -> None:
    # Execute: the same number of calls with 50 and with 200 clients.
    parts = {}
    for clients in (50, 200):
        run(_config(tmp_path, algorithm, clients))
        parts[clients] = received.pop()
    # Check: one part per call, each summing its call's clients.
    for clients, round_parts in parts.items():
        assert [count for count, _ in round_parts] == [clients // CALLS] * CALLS
    small, large = (np.array([nbytes for _, nbytes in parts[m]]) for m in (50, 200))
    if algorithm == "fedavg":
        assert (small == large).all()  # Σ n_i θ_i and Σ n_i: the size of one model
    else:
        k = 10  # per client: its id (8 bytes), its row p̃_i and its row norms (K float32 each)
        per_client = 8 + 2 * 4 * k
        assert ((large - small) == (200 - 50) // CALLS * per_client).all()
        assert (small - 50 // CALLS * per_client == large - 200 // CALLS * per_client).all()


def test_ray_server_receives_one_model_sized_part_per_call(tmp_path, ray_cluster) -> None:
    # 200 clients in 2 calls on 2 ClientWorker actors: the server gets 2 model-sized parts.
    config = _config(tmp_path, "fedavg", 200, **{"engine.backend": "ray", "engine.num_workers": CALLS})
    received_bytes = run(config).history[0]["server_bytes_received"]
    assert received_bytes == CALLS * (MODEL_FLOATS * 4 + 8)


def test_cwfedavg_keeps_nothing_per_client_between_rounds(tmp_path) -> None:
    # Prepare: cwFedAvg (Output) over 40 clients, half of them per round.
    clients = 40
    sim = Simulation(_config(tmp_path, "cwfedavg", clients, **{"train.rounds": 3, "engine.join_ratio": 0.5}))
    fresh = ClientRunner(sim.config, sim.spec, sim.dataset, sim.partition)
    sim.run()
    # Check: the server holds K heads, the shared layers and two M x K tables; nothing else.
    state = sim.executor.server_state()
    k, p = 10, MODEL_FLOATS
    head = 512 * k + k
    assert {name: value.shape for name, value in state.items()} == {
        "heads": (k, head),
        "shared": (p - head,),
        "p_tilde": (clients, k),
        "norms": (clients, k),
    }
    assert len(sim.states) == 0  # no per-client state on the driver (cnn4 has no BatchNorm buffers)
    runner = sim.executor.runner  # type: ignore[attr-defined]
    assert set(vars(runner)) == set(vars(fresh))  # the worker added no attribute while training
    assert list(runner._models) == ["cnn4"]  # one model per architecture, whatever the clients
