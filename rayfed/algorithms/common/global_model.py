"""One global model that every client starts from: the message, the client and the server state of the methods
that keep a single θ_g (FedAvg and its server-side variants: FedAdam, FedDyn, FedDisco, L-DAWA, FedLAW,
FedAWA, FedNH).

:class:`GlobalModelServer` holds θ_g (parameters then buffers) of the run's single architecture and
saves it under :data:`GLOBAL_STATE`; a subclass adds its own state through :meth:`extra_state`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from rayfed.algorithms.common.architecture import require_homogeneous, sole_architecture
from rayfed.algorithms.contributions import ClientVectors, WeightedState
from rayfed.algorithms.declarations import SharedBody, SharedBodyEvaluation
from rayfed.algorithms.hooks import ClientHalf, Contribution, ServerHalf, Start
from rayfed.train.problem import ProblemSpec

if TYPE_CHECKING:
    from rayfed.train.job import ClientJob

__all__ = ["GLOBAL_STATE", "GlobalModel", "GlobalModelClient", "WholeModelsClient", "GlobalModelServer"]

P = TypeVar("P")
C = TypeVar("C", bound=Contribution)

GLOBAL_STATE = "global"
"""Name of θ_g in a server half's state (checkpoints: ``server/global``)."""


@dataclass(frozen=True)
class GlobalModel:
    """The message of a method with one global model: θ_g (parameters then buffers), which every client starts
    from."""

    vector: np.ndarray


M = TypeVar("M", bound=GlobalModel)


class GlobalModelClient(ClientHalf[P, M], SharedBodyEvaluation):
    """FedAvg's client: it starts from θ_g, trains, and sends its model weighted by its training samples; it is
    evaluated with θ_g itself (the one model)."""

    def start(self, message: M, job: ClientJob) -> Start:
        return Start(message.vector)

    def upload(self, message: M, job: ClientJob) -> Contribution | WeightedState:
        return WeightedState()

    def shared_body(self, message: M, jobs: Sequence[ClientJob]) -> SharedBody | None:
        """Every client is evaluated with the global model itself, in one forward for all of them; a subclass that
        evaluates other models (its own ``start`` or ``evaluation``: Ditto's personal models) is evaluated client
        by client."""
        own = type(self)
        if own.start is not GlobalModelClient.start or own.evaluation is not ClientHalf.evaluation:
            return None
        return SharedBody(message.vector)


class WholeModelsClient(GlobalModelClient[P, GlobalModel]):
    """A client that starts from θ_g and sends its whole state as one row of a :class:`ClientVectors` (server
    halves that weigh each client's model themselves: L-DAWA, FedLAW)."""

    def upload(self, message: GlobalModel, job: ClientJob) -> Contribution:
        return ClientVectors.of(job.trained.clone(), job.client_id, job.num_train)


class GlobalModelServer(ServerHalf[P, C]):
    """A server half that keeps θ_g, the global model of the run's single architecture.

    It broadcasts :class:`GlobalModel` by default, which :class:`GlobalModelClient` reads; ``aggregate`` is the
    subclass's rule.
    """

    @classmethod
    def validate(cls, params: P, spec: ProblemSpec) -> None:
        require_homogeneous(spec)

    def __init__(self, params: P, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)  # validates
        self.architecture = sole_architecture(spec)
        self.global_vector = np.array(initial[self.architecture], dtype=np.float32)

    def broadcast(self) -> GlobalModel:
        return GlobalModel(self.global_vector)

    def extra_state(self) -> dict[str, np.ndarray]:
        """State the subclass keeps beside θ_g (saved and restored with it); none by default."""
        return {}

    def load_extra_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`extra_state` returned."""

    def state_dict(self) -> dict[str, np.ndarray]:
        return {GLOBAL_STATE: self.global_vector, **self.extra_state()}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.global_vector = np.array(state[GLOBAL_STATE], dtype=np.float32)
        self.load_extra_state(state)
