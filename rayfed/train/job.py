"""One virtual client's work for one round: :class:`ClientJob`, and what local training reports.

A :class:`ClientJob` is what a worker hands to an algorithm for one client in one
round: the client's id and data, the worker's model for the client's architecture
(as a :class:`~rayfed.train.flat.FlatModel`), the round's optimiser settings, the
client's persistent state, if its algorithm keeps any, what its client half started it
from and what its phases' trainables ended at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rayfed.train.flat import FlatModel

if TYPE_CHECKING:  # the config sits above the training code (docs/architecture.md)
    from rayfed.train.settings import TrainConfig

__all__ = ["EVALUATION_ROUND", "ClientJob", "ClientState", "seed_global_generators"]

EVALUATION_ROUND = -1
"""The ``round`` of a job built to evaluate a client (its generator's stream, not a training round)."""

ClientState = dict[str, Any]
"""What a client keeps between rounds (the client state store's values): named arrays. While its call runs a
value may be a tensor on the worker's device; the call reads the states back with its numbers, as arrays."""


@dataclass
class ClientJob:
    """Everything one client's local update or evaluation needs, built by the worker."""

    client_id: int
    round: int
    worker_model: FlatModel
    """The worker's model of the client's architecture; read it as :attr:`flat`."""
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
    step_budget: int | None = None
    """The local steps the client may still take this round, over the phases the budget covers (``Phase.budgeted``)
    in order (its partial work before a deadline, ``RoundFacts.step_budget``); None: every step its phases draw.
    The batches drawn beyond it are not trained (:func:`rayfed.train.step.phase_batches`)."""
    trained_steps: int = 0
    """The local steps the client took this round over all its phases, reported or not (what a system model's clock
    charges it: docs/system.md)."""
    state: ClientState | None = None
    """Persistent per-client state (e.g. FedClassAvg's backbone); client halves may replace it."""
    start: Any = None
    """What the client half's ``start`` returned for this round: the starting model, or a ``Start`` carrying it
    and what the client made of the message (``rayfed.algorithms.hooks.Start``)."""
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    """The final values of the trainables its phases trained (``Phase.extra``), on the device."""
    pending: tuple[torch.Tensor, int] | None = field(default=None, repr=False)
    """(a stack's trained states, this client's row) not yet loaded into :attr:`worker_model`: a stack's client is
    loaded when its model is first read (:attr:`flat`, :attr:`model`), and not at all when only its state is
    (:attr:`trained`)."""

    @property
    def flat(self) -> FlatModel:
        """The worker's model holding this client's model (its trained one, once it has trained)."""
        if self.pending is not None:
            stack, row = self.pending
            self.pending = None
            self.worker_model.load_state(stack[row])
        return self.worker_model

    @property
    def trained(self) -> torch.Tensor:
        """The client's model as a state (parameters, then buffers) on the device, without a copy: after training,
        what it trained (a client half's ``upload`` reads it, and must not change it)."""
        if self.pending is not None:
            stack, row = self.pending
            return stack[row]
        return self.worker_model.state(copy=False)

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
        return self.worker_model.vector.device


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
