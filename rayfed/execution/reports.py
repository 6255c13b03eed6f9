"""What a worker call returns: one summed contribution, a few numbers per client, the clients' new states."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rayfed.algorithms import Contribution

if TYPE_CHECKING:  # a node agent reads reports without torch, which rayfed.train.job imports
    from rayfed.train.job import ClientState

__all__ = ["ClientReport", "EvalReport", "TrainResult"]


@dataclass(frozen=True)
class ClientReport:
    """What the driver learns about one client's local update (a few numbers)."""

    client_id: int
    num_train: int
    train_loss: float
    steps: int
    """The steps of the phases that report (``Phase.reports``), over which ``train_loss`` is the mean."""
    update_norm: float
    bytes_up: int
    bytes_down: int
    seconds: float
    rejected: str = ""
    """Why the update was left out of the aggregation ("" = accepted)."""
    train_loss_eval: float = math.nan
    """Mean cross-entropy of the client's starting model over its train split (``engine.eval_train_loss``), else NaN."""
    local_num_test: int = 0
    """Test samples the trained model was evaluated on (``engine.eval_local``); 0 when it was not."""
    local_correct: int = 0
    """Correct predictions of the client's model right after its local training on its own test split."""
    trained_steps: int = 0
    """The steps it took over all its phases, reported or not (Ditto's personal phase too): its work."""


@dataclass(frozen=True)
class EvalReport:
    """One client's test results: its own evaluation model's, and the global model's if the algorithm has one."""

    client_id: int
    num_test: int
    correct: int
    loss_sum: float
    global_correct: int | None = None
    """Correct predictions of the global model (``ClientHalf.global_model``); None without one."""
    global_loss_sum: float | None = None


@dataclass
class TrainResult:
    """A training call's result: the accepted clients' summed contribution (None if none was accepted),
    one report per client, and the new states of the accepted clients that keep one."""

    contribution: Contribution | None
    reports: list[ClientReport]
    states: dict[int, ClientState] = field(default_factory=dict)
