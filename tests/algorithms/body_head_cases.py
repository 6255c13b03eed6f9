"""Shared pieces of the body/head and Ditto tests: a two-block model, client jobs, a round recorder."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rayfed import RunConfig, run
from rayfed.algorithms import ClientHalf, Contribution, ServerHalf
from rayfed.config import TrainConfig
from rayfed.engine.callbacks import Callback
from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob
from rayfed.train.problem import ProblemSpec
from tests.algorithms.read_back import settled
from tests.conftest import client_job, tiny_overrides


class Tiny(nn.Module):
    """Two blocks: ``body`` (3 -> 4, ReLU; optionally BatchNorm) and the output layer ``fc`` (4 -> 2)."""

    output_layer = "fc"

    def __init__(self, batchnorm: bool = False) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)) if batchnorm else nn.Sequential(nn.Linear(3, 4))
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.body(x)))


def tiny_problem(num_clients: int = 3, *, batchnorm: bool = False, seed: int = 0) -> tuple[FlatModel, ProblemSpec]:
    """The model as a FlatModel and a ProblemSpec of ``num_clients`` clients using it."""
    torch.manual_seed(seed)
    flat = FlatModel(Tiny(batchnorm))
    spec = ProblemSpec(
        num_clients,
        2,
        (1, 1, 3),
        {"tiny": flat.layout},
        {"tiny": ("body", "fc")},
        {"tiny": "fc"},
        default_architecture="tiny",
        buffer_layouts={"tiny": flat.buffer_layout},
    )
    return flat, spec


def job(flat: FlatModel, cid: int, n: int = 12, **train: Any) -> ClientJob:
    """Client ``cid`` with ``n`` random samples of both classes; ``train`` overrides TrainConfig
    (default: one full batch, so one epoch is one SGD step on all samples)."""
    gen = torch.Generator().manual_seed(cid)
    x = torch.randn(n, 3, generator=gen)
    y = torch.arange(n) % 2
    settings = TrainConfig(**{"lr": 0.1, "batch_size": n, **train})
    return client_job(flat, x, y, train=settings, client_id=cid, generator=gen, num_classes=2)


def full_batch_gradient(flat: FlatModel, client: ClientJob, vector: np.ndarray) -> np.ndarray:
    """∇F(w) of the mean cross-entropy over all of ``client``'s samples at ``vector`` (left loaded in ``flat``)."""
    flat.load(vector)
    flat.zero_grad()
    F.cross_entropy(flat.module(client.x_train), client.y_train).backward()
    return flat.grad.numpy().copy()


def upload_trained(
    server: ServerHalf[Any, Any],
    half: ClientHalf[Any, Any],
    flat: FlatModel,
    trained: np.ndarray,
    sizes: Sequence[int],
    *,
    whole_state: bool = False,
) -> tuple[list[Contribution], list[ClientJob]]:
    """Clients 0, 1, ... with ``sizes`` samples: each starts from the server's message (``half.start``), then row
    i of ``trained`` (parameters, or the whole state with ``whole_state``) stands for its local training, and it
    uploads (read back as a worker's call reads it). Returns the uploads and the jobs (whose ``state`` holds what
    each client kept)."""
    uploads, jobs = [], []
    message = server.broadcast()
    for cid, (row, n) in enumerate(zip(trained, sizes)):
        client = job(flat, cid, n)
        client.start = half.start(message, client)
        flat.load_state(client.start.model)
        if whole_state:
            flat.load_state(row)
        else:
            flat.load(row)
        uploads.append(settled(half.upload(message, client), client))
        jobs.append(client)
    return uploads, jobs


class RoundLog(Callback):
    """Per round: the server's state, every client's persisted state and the round's client rows."""

    def __init__(self) -> None:
        self.server: list[dict[str, np.ndarray]] = []
        self.states: list[dict[int, dict[str, np.ndarray]]] = []
        self.clients: list[dict[str, list[Any]]] = []
        self.spec: ProblemSpec | None = None

    def after_round(self, run, record, clients) -> bool:  # noqa: ANN001
        self.spec = run.spec
        self.server.append({k: np.array(v) for k, v in run.server_state().items()})
        self.states.append({cid: {k: np.array(v) for k, v in state.items()} for cid, state in run.client_states()})
        self.clients.append(clients.to_pydict())
        return False


def run_logged(path: Path, algorithm: str, params: dict[str, Any] | None = None, **extra: Any):  # noqa: ANN201
    """A tiny run (10 clients, 1000 synthetic samples, 2 rounds) of ``algorithm``; returns (result, log)."""
    log = RoundLog()
    overrides = tiny_overrides(
        path,
        **{
            "algorithm.name": algorithm,
            "algorithm.params": params or {},
            "data.options": {"num_samples": 1000},
            "engine.checkpoint_every": 0,
            **extra,
        },
    )
    return run(RunConfig().override(overrides), callbacks=[log]), log


def sampled_rows(log: RoundLog, round_index: int) -> list[dict[str, Any]]:
    """The client rows of the clients that trained in round ``round_index``."""
    table = log.clients[round_index]
    rows = [dict(zip(table, values)) for values in zip(*table.values())]
    return [row for row in rows if row["sampled"]]


def assert_local_parts_kept(log: RoundLog, key: str, size: int) -> None:
    """Every round: a client that trained holds a new ``key`` of ``size`` floats, one that sat out
    keeps its previous one bit for bit, and no two clients hold the same."""
    assert log.spec is not None
    kept = 0
    for r in range(1, len(log.states)):
        trained = {row["client_id"] for row in sampled_rows(log, r)}
        assert 0 < len(trained) < log.spec.num_clients  # partial participation
        for cid, state in log.states[r].items():
            assert state[key].shape == (size,)
            before = log.states[r - 1].get(cid)
            if cid in trained:
                assert before is None or not np.array_equal(state[key], before[key])
            else:
                np.testing.assert_array_equal(state[key], before[key])
                kept += 1
    assert kept  # some client sat a round out while holding its part
    last = [state[key] for state in log.states[-1].values()]
    assert all(not np.array_equal(a, b) for i, a in enumerate(last) for b in last[i + 1 :])
