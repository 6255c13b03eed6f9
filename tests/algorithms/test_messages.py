"""What a client downloads by default (``ClientHalf.bytes_down``): the arrays of the round's message, less the
fields every client already holds (``HELD_BY_CLIENTS``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rayfed.algorithms.common.global_model import GlobalModel
from rayfed.algorithms.ditto import DittoModels
from rayfed.algorithms.hooks import HELD_BY_CLIENTS, message_bytes


@dataclass(frozen=True)
class _Inner:
    rows: np.ndarray
    name: str


@dataclass(frozen=True)
class _Message:
    model: np.ndarray
    parts: tuple[_Inner, ...]
    mine: np.ndarray = field(metadata=HELD_BY_CLIENTS)
    scale: float = 2.0


def test_a_message_weighs_its_arrays_through_nested_fields_less_what_clients_hold() -> None:
    message = _Message(
        np.zeros(10, np.float32),
        (_Inner(np.zeros((2, 3), np.float64), "a"), _Inner(np.zeros(4, np.int64), "b")),
        mine=np.zeros(1000, np.float32),
    )
    assert message_bytes(message) == 40 + 48 + 32  # the held array, the number and the names weigh nothing


def test_a_global_model_weighs_its_vector_and_dittos_initialisation_is_held() -> None:
    vector = np.zeros(25, np.float32)
    assert message_bytes(GlobalModel(vector)) == 100
    assert message_bytes(DittoModels(vector, np.ones(25, np.float32))) == 100
