"""Local-only training: every client trains its own model and nothing is aggregated.

The "local only" baseline of the personalised-FL papers (e.g. FedClassAvg, ICPP 2022,
Table 2; docs/algorithms.md, local training section). Each client starts from its *own*
random initialisation, drawn from (run seed, client id), so clients are independent, as
they would be without any federation; it then trains with the client half (plain SGD on
cross-entropy unless ``algorithm.client`` borrows another one) whenever it is sampled,
and its model stays in the engine's client state store between rounds. Evaluation uses
the model the client holds: its last trained one, or its initialisation if it never trained.

Nothing travels: uploads and downloads are 0 bytes.

The per-client initialisation and the persisted model come from
:mod:`rayfed.algorithms.common.own_models`, shared with the other methods whose clients keep
their own model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfed.algorithms.common.own_models import ClientInit, own_model_state, save_model_state
from rayfed.algorithms.hooks import ClientHalf, Contribution, NoParams, RoundContext, ServerHalf, Start
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.job import ClientJob
from rayfed.train.problem import ProblemSpec

__all__ = ["NoUpload", "OwnModels", "OwnModelClient", "LocalServer"]


@dataclass
class NoUpload(Contribution):
    """An empty upload that only counts the clients that trained."""

    count: int = 1

    def __add__(self, other: NoUpload) -> NoUpload:
        return NoUpload(self.count + other.count)

    def __iadd__(self, other: NoUpload) -> NoUpload:
        self.count += other.count
        return self


@dataclass(frozen=True)
class OwnModels:
    """The (empty) message of local-only training: how each client draws its own initial model."""

    init: ClientInit


class OwnModelClient(ClientHalf[Any, OwnModels]):
    """A client that trains its own model, kept in its state, and sends nothing."""

    def start(self, message: OwnModels, job: ClientJob) -> Start:
        return Start(own_model_state(job, message.init))

    def upload(self, message: OwnModels, job: ClientJob) -> Contribution:
        save_model_state(job)
        return NoUpload()


class LocalServer(ServerHalf[NoParams, NoUpload]):
    """Holds nothing; counts the clients that trained."""

    def __init__(self, params: NoParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        self.message = OwnModels(ClientInit.of(spec))

    def broadcast(self) -> OwnModels:
        return self.message

    def aggregate(self, ctx: RoundContext, contribution: NoUpload) -> dict[str, float]:
        return {"clients_trained": float(contribution.count)}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        return None


register_algorithm(
    "local",
    params=NoParams,
    server=LocalServer,
    client=OwnModelClient,
    summary="Local-only training: each client trains its own model, kept in the client state store; no aggregation",
    keeps_client_state=True,
    reporting=Reporting(label="Local"),
)
