"""A model small enough to check an algorithm's equations by hand: 3 inputs, a 4-unit body, K classes.

The unit tests of the methods that act on the output layer or the penultimate features
(cwFedAvg, FedNH, FedUV) build their clients here: the architecture ``tiny`` with the blocks
``body`` and ``fc``, and clients holding ``counts[j]`` random inputs of class j.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rayfed.config import TrainConfig
from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob
from rayfed.train.problem import ProblemSpec
from tests.conftest import client_job

__all__ = ["TinyNet", "tiny_problem", "tiny_job"]


class TinyNet(nn.Module):
    """``body`` (3 -> 4, ReLU) and the output layer ``fc`` (4 -> K)."""

    output_layer = "fc"

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.body(x)))


def tiny_problem(num_clients: int, num_classes: int, algorithm: str = "") -> tuple[FlatModel, ProblemSpec]:
    """The model (initialised from seed 0) and the spec of ``num_clients`` clients of the architecture ``tiny``."""
    torch.manual_seed(0)
    flat = FlatModel(TinyNet(num_classes))
    spec = ProblemSpec(
        num_clients,
        num_classes,
        (1, 1, 3),
        {"tiny": flat.layout},
        {"tiny": ("body", "fc")},
        {"tiny": "fc"},
        default_architecture="tiny",
        algorithm=algorithm,
    )
    return flat, spec


def tiny_job(flat: FlatModel, cid: int, counts: list[int], train: TrainConfig) -> ClientJob:
    """Client ``cid`` holding ``counts[j]`` random inputs of class j (seed ``cid``), as train and test data."""
    gen = torch.Generator().manual_seed(cid)
    x = torch.randn(sum(counts), 3, generator=gen)
    y = torch.as_tensor(np.repeat(np.arange(len(counts)), counts))
    return client_job(flat, x, y, train=train, client_id=cid, generator=gen, num_classes=len(counts))
