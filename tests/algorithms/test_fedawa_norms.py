"""FedAWA's squared norms made by the workers: the same bits as the server's, read by the server instead of a pass
over the uploads, asked for only where the objective is matrix-free."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rayfed import RunConfig, run
from rayfed.algorithms import RoundContext, fedawa_objective, sum_contributions
from rayfed.algorithms import contributions as contributions_module
from rayfed.algorithms.contributions import ClientVectors, row_square_norms
from rayfed.algorithms.fedawa import FedAWALServer, FedAWAModel, FedAWAParams, FedAWAServer
from rayfed.algorithms.fedawa_objective import MatrixFreeProducts
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec
from tests.algorithms.read_back import settled
from tests.conftest import tiny_overrides

# Parameters of odd sizes, so that the ranges start at every alignment; one buffer after them.
LAYOUT = ParamLayout(("a.weight", "a.bias", "b.weight"), ((37, 29), (7,), (513,)), (0, 1073, 1080, 1593))
BUFFERS = ParamLayout(("b.running_mean",), ((5,),), (0, 5))
P, S = LAYOUT.size, LAYOUT.size + BUFFERS.size


def _spec(num_clients: int = 7) -> ProblemSpec:
    return ProblemSpec(
        num_clients,
        2,
        (1, 2, 2),
        {"m": LAYOUT},
        {"m": ("a", "b")},
        {"m": "b"},
        default_architecture="m",
        buffer_layouts={"m": BUFFERS},
    )


def _rows(seed: int, m: int = 7) -> np.ndarray:
    """Client vectors of very different scales (the float32 sums round differently)."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(m, S)) * np.logspace(-3, 1, m)[:, None]).astype(np.float32)


def _calls_read_back(rows: np.ndarray, message: FedAWAModel, split: int) -> ClientVectors:
    """The uploads of two workers' calls (rows[:split], rows[split:]) as tensors, each call summed and read back as
    its settlement does, then joined on the server."""
    calls = []
    for ids in (range(split), range(split, len(rows))):
        uploads = (ClientVectors.of(torch.from_numpy(rows[i]), i, 10.0 + i, None, message.norm_slices) for i in ids)
        calls.append(settled(sum_contributions(uploads)))
    return calls[0] + calls[1]


@pytest.mark.parametrize("split", [1, 3, 6])
def test_a_workers_square_norms_are_the_servers_bit_for_bit(split: int) -> None:
    # Arrange
    rows = _rows(split)
    slices = (slice(0, 1073), slice(1073, 1080), slice(1080, 1593), slice(3, 1590))
    message = FedAWAModel(np.zeros(S, np.float32), False, slices)
    # Act
    joined = _calls_read_back(rows, message, split)
    # Assert: rows of a call computed alone give what the server computes from the whole matrix
    assert joined.square_norms is not None and joined.square_norms.shape == (7, 4)
    server = MatrixFreeProducts(joined.matrix(), np.ones(S, np.float32), slices)
    assert joined.square_norms.dtype == np.float32
    np.testing.assert_array_equal(joined.square_norms.T.astype(np.float64), server.diag)
    np.testing.assert_array_equal(joined.square_norms, row_square_norms(rows, slices))


@pytest.mark.parametrize("server_cls", [FedAWAServer, FedAWALServer])
def test_the_server_reads_the_workers_norms_and_aggregates_the_same_bits(monkeypatch, server_cls: type) -> None:
    # Arrange: two servers alike; one gets the workers' norms, the other the rows alone
    rng = np.random.default_rng(0)
    initial = {"m": rng.normal(size=S).astype(np.float32)}
    given, alone = (server_cls(FedAWAParams(), _spec(), initial) for _ in range(2))
    message = given.broadcast()
    ctx = RoundContext(round=0, seed=0, lr=0.1, sampled=np.arange(7))
    with_norms = _calls_read_back(_rows(1), message, 4)
    without = dataclasses.replace(with_norms, norm_slices=(), square_norms=None)
    server_passes: list[int] = []
    counted = fedawa_objective.row_square_norms

    def row_square_norms(*args):
        server_passes.append(1)
        return counted(*args)

    monkeypatch.setattr(fedawa_objective, "row_square_norms", row_square_norms)
    # Act
    given.aggregate(ctx, with_norms)
    passes_with_norms = len(server_passes)
    alone.aggregate(ctx, without)
    # Assert
    assert message.norm_slices == given.groups.param_slices
    assert len(message.norm_slices) == (3 if server_cls is FedAWALServer else 1)
    assert passes_with_norms == 0 and len(server_passes) == 1
    np.testing.assert_array_equal(given.global_vector, alone.global_vector)
    np.testing.assert_array_equal(given.client_state, alone.client_state)


@pytest.mark.parametrize("params", [FedAWAParams(fidelity="exact"), FedAWAParams(server_steps=3)])
def test_servers_that_form_the_gram_matrix_ask_for_no_norms(params: FedAWAParams) -> None:
    # Arrange
    server = FedAWAServer(params, _spec(), {"m": np.zeros(S, np.float32)})
    # Act
    message = server.broadcast()
    upload = ClientVectors.of(np.ones(S, np.float32), 0, 1.0, None, message.norm_slices)
    # Assert: nothing made, no bytes added to the upload
    assert message.norm_slices == () and upload.square_norms is None
    assert upload.nbytes == ClientVectors.of(np.ones(S, np.float32), 0, 1.0).nbytes


def test_uploads_with_and_without_norms_or_over_other_ranges_do_not_add() -> None:
    rows = np.ones((2, S), np.float32)
    with_norms = ClientVectors.of(rows[0], 0, 1.0, None, (slice(0, P),))
    with pytest.raises(ValueError, match="different ranges"):
        with_norms + ClientVectors.of(rows[1], 1, 1.0, None, (slice(0, 5),))
    with pytest.raises(ValueError, match="squared norms to client vectors without"):
        with_norms + dataclasses.replace(ClientVectors.of(rows[1], 1, 1.0, None, (slice(0, P),)), square_norms=None)


@pytest.mark.parametrize("algorithm", ["fedawa", "fedawa_l"])
def test_in_a_run_the_workers_make_the_norms_and_the_server_none(tmp_path, monkeypatch, algorithm: str) -> None:
    # Arrange: count who computes squared norms (the server's fallback is fedawa_objective's name for it)
    made: dict[str, int] = {"workers": 0, "server": 0}
    counted = contributions_module.row_square_norms

    def counting(who: str):
        def row_square_norms(*args):
            made[who] += 1
            return counted(*args)

        return row_square_norms

    monkeypatch.setattr(contributions_module, "row_square_norms", counting("workers"))
    monkeypatch.setattr(fedawa_objective, "row_square_norms", counting("server"))
    # Act
    result = run(RunConfig().override(tiny_overrides(tmp_path / "run", **{"algorithm.name": algorithm})))
    # Assert
    assert result.rounds_run == 2
    assert made["workers"] > 0 and made["server"] == 0
