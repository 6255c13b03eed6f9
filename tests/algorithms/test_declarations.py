"""The opt-in declarations of a client half (``rayfed.algorithms.declarations``), answered for a half alone and for
one that borrows another's phases (``algorithm.client``): it evaluates as its own half declares, and its models
read normalised features if either half's do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rayfed import RunConfig
from rayfed.algorithms import resolve
from rayfed.algorithms.declarations import evaluation_reads_train, normalizes_features, shared_body
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.engine.inputs import RunInputs
from tests.conftest import tiny_overrides


def _client(tmp_path: Path, name: str, lent: str | None = None):  # noqa: ANN202
    config = RunConfig().override(
        tiny_overrides(tmp_path, **{"algorithm.name": name, **({"algorithm.client": lent} if lent else {})})
    )
    algorithm = resolve(config.algorithm)
    spec = RunInputs.prepare(config, algorithm, tmp_path, continues=False).spec
    return algorithm.make_client(spec), spec


@pytest.mark.parametrize(
    ("name", "lent", "normalized", "reads_train"),
    [
        ("fedavg", None, False, False),
        ("fednh", None, True, False),
        ("fedbabu", None, False, True),
        ("ifca", None, False, True),
        ("fedavg", "fednh", True, False),  # the lent cosine classifier needs normalised features
        ("fedavg", "fedbabu", False, False),  # evaluated as FedAvg's client: no fine-tuning on the train split
        ("fedbabu", "fedprox", False, True),
    ],
)
def test_declarations_of_a_half_and_of_a_borrowing_one(
    name: str, lent: str | None, normalized: bool, reads_train: bool, tmp_path: Path
) -> None:
    client, _ = _client(tmp_path, name, lent)
    assert (normalizes_features(client), evaluation_reads_train(client)) == (normalized, reads_train)


def test_a_shared_body_is_asked_of_the_half_that_evaluates(tmp_path: Path) -> None:
    # FedAvg's clients are evaluated with the global model: one shared body, whatever phases they borrow.
    client, spec = _client(tmp_path, "fedavg", "ditto")
    message = FedAvgServer(None, spec, {spec.default_architecture: np.arange(4, dtype=np.float32)}).broadcast()
    plan = shared_body(client, message, [])
    assert plan is not None and plan.weight is None and np.array_equal(plan.state, np.arange(4))
    # Ditto's own clients are evaluated with their personal models: it declares none.
    ditto, _ = _client(tmp_path / "ditto", "ditto")
    assert shared_body(ditto, message, []) is None
