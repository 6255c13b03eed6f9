"""The ``train`` section of a run's config: rounds and local training."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rayfed.util.documented import documented, section
from rayfed.util.validation import check

__all__ = ["TrainConfig"]


@section("train")
@dataclass(frozen=True)
class TrainConfig:
    """Rounds and local training. Defaults: the cwFedAvg papers (SGD, lr 0.005, batch 10, 1 epoch)."""

    rounds: int = documented(100, "Communication rounds.")
    local_epochs: int = documented(1, "Epochs of local SGD per client per round.")
    batch_size: int = documented(10, "Mini-batch size of local SGD.")
    lr: float = documented(0.005, "Learning rate of local SGD (of round 0, with lr_decay).")
    momentum: float = documented(0.0, "SGD momentum in [0, 1) (FedAWA's clients use 0.9).")
    weight_decay: float = documented(0.0, "L2 weight decay of local SGD (FedAWA's clients use 5e-4).")
    lr_decay: float = documented(1.0, "Per-round multiplicative learning-rate decay in (0, 1] (FedAWA's code: 0.99).")
    drop_last: bool = documented(
        True,
        "Drop the last incomplete mini-batch, as PFLlib does; a client with fewer than batch_size training "
        "samples then takes no step (warned about before the run; refused when no client can step).",
    )

    def __post_init__(self) -> None:
        check(self.rounds >= 1, "train.rounds", self.rounds, ">= 1")
        check(self.local_epochs >= 1, "train.local_epochs", self.local_epochs, ">= 1")
        check(self.batch_size >= 1, "train.batch_size", self.batch_size, ">= 1")
        check(self.lr > 0 and math.isfinite(self.lr), "train.lr", self.lr, "a finite number > 0")
        check(0 <= self.momentum < 1, "train.momentum", self.momentum, "in [0, 1)")
        check(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, ">= 0")
        check(0 < self.lr_decay <= 1, "train.lr_decay", self.lr_decay, "in (0, 1]")

    def lr_at(self, round_index: int) -> float:
        """Learning rate of round ``round_index`` (0-based) after decay."""
        return self.lr * self.lr_decay**round_index
