"""One virtual client's work for one round: :class:`ClientJob`, and what local training reports.

A :class:`ClientJob` is what a worker hands to an algorithm for one client in one
round: the client's id and data, the worker's model for the client's architecture
(as a :class:`~rayfed.train.flat.FlatModel`), the round's optimiser settings and the
client's persistent state, if its algorithm keeps any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from rayfed.train.flat import FlatModel
from rayfed.train.scratch import Scratch

if TYPE_CHECKING:  # the config sits above the training code (docs/architecture.md)
    from rayfed.train.settings import TrainConfig

__all__ = ["EVALUATION_ROUND", "ClientJob", "ClientState", "TrainStats", "seed_global_generators"]

EVALUATION_ROUND = -1
"""The ``round`` of a job built to evaluate a client (its generator's stream, not a training round)."""

ClientState = dict[str, np.ndarray]
"""What a client keeps between rounds (the client state store's values): named arrays."""


@dataclass
class ClientJob:
    """Everything one client's local update or evaluation needs, built by the worker."""

    client_id: int
    round: int
    flat: FlatModel
    architecture: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    label_counts: np.ndarray
    """(K,) class counts over the client's whole partition, before the train/test split."""
    train_label_counts: np.ndarray
    """(K,) class counts over the client's training split."""
    train: TrainConfig
    """The run's local-training settings (epochs, batch size, momentum, ...), passed whole."""
    lr: float
    """This round's learning rate (``RoundContext.lr``: ``train.lr`` after ``train.lr_decay``)."""
    generator: torch.Generator
    """Seeded from (run seed, round, client id): the same client gets the same batches on any worker.
    Evaluation jobs draw from round :data:`EVALUATION_ROUND`, so they never replay a training round's."""
    state: ClientState | None = None
    """Persistent per-client state (e.g. FedClassAvg's backbone); algorithms may replace it."""
    scratch: Scratch = field(default_factory=Scratch)
    """Per-job values an algorithm passes between its hooks, under typed keys (e.g. FedProx's anchor)."""

    @property
    def model(self) -> torch.nn.Module:
        return self.flat.module

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.y_test.shape[0])

    @property
    def device(self) -> torch.device:
        return self.flat.vector.device


@dataclass(frozen=True)
class TrainStats:
    """What local training reports: mean cross-entropy over the steps taken and their number.

    ``loss`` may be a 0-d tensor on the job's device: the worker reads the call's losses in one
    transfer, after every client of the call trained, so the step loop never waits for the host.
    """

    loss: float | torch.Tensor
    steps: int


def seed_global_generators(seed: int, device: torch.device) -> None:
    """Seed the global generators that layers such as dropout draw from on ``device``: the CPU
    one, and on a GPU the CUDA ones.

    ``torch.manual_seed`` would also queue a seeding call for every accelerator backend not yet
    initialised, formatting a stack trace for each: about 0.5 ms per client on a CUDA build
    without a GPU. The CPU generator receives the same seed either way.
    """
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)
