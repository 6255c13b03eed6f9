"""One global model that every client starts from: the broadcasts and the server state of the methods
that keep a single θ_g (FedAvg and its server-side variants: FedAdam, FedDyn, FedDisco, L-DAWA, FedLAW,
FedAWA, FedNH).

:class:`GlobalModelServer` holds θ_g (parameters then buffers) of the run's single architecture and
saves it under :data:`GLOBAL_STATE`; a subclass adds its own state through :meth:`extra_state`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from rayfed.algorithms.common.architecture import require_homogeneous, sole_architecture
from rayfed.algorithms.contributions import ClientVectors, WeightedSum
from rayfed.algorithms.hooks import Broadcast, Contribution, ServerHalf, SharedBody
from rayfed.train.problem import ProblemSpec

if TYPE_CHECKING:
    from rayfed.train.job import ClientJob

__all__ = ["GLOBAL_STATE", "GlobalStart", "GlobalModel", "WholeModels", "GlobalModelServer"]

P = TypeVar("P")
C = TypeVar("C", bound=Contribution)

GLOBAL_STATE = "global"
"""Name of θ_g in a server half's state (checkpoints: ``server/global``)."""


@dataclass(frozen=True)
class GlobalStart(Broadcast):
    """One global model (parameters then buffers) that every client starts from; the upload is the subclass's."""

    vector: np.ndarray

    def personalise(self, job: ClientJob) -> None:
        job.flat.load_state(self.vector)

    def personalise_stacked(self, jobs: Sequence[ClientJob]) -> Any:
        """Every client starts from θ_g: one copy to the device, seen C times."""
        from rayfed.train.host import to_device  # workers only: the server stays free of torch

        return to_device([self.vector], jobs[0].device)[0].expand(len(jobs), -1)

    def bytes_down(self, job: ClientJob) -> int:
        return int(self.vector.nbytes)

    def shared_body(self, jobs: Sequence[ClientJob]) -> SharedBody | None:
        """Every client is evaluated with the global model itself (a subclass whose ``prepare_eval``
        loads another model says so here)."""
        return SharedBody(self.vector)


@dataclass(frozen=True)
class GlobalModel(GlobalStart):
    """The global model; a trained client sends its model weighted by its training samples (FedAvg's upload)."""

    def contribute(self, job: ClientJob) -> WeightedSum:
        return WeightedSum.of(job.flat.state(copy=False), job.num_train)

    def contribute_stacked(self, jobs: Sequence[ClientJob], states: Any) -> WeightedSum | None:
        """Σ_i n_i θ_i as one matrix-vector product."""
        from rayfed.train.host import to_device

        sizes = np.array([job.num_train for job in jobs], dtype=np.float32)
        return WeightedSum(to_device([sizes], states.device)[0] @ states, float(sizes.sum()), len(jobs))


@dataclass(frozen=True)
class WholeModels(GlobalStart):
    """The global model; a trained client sends its whole state as one row of a :class:`ClientVectors`
    (server halves that weigh each client's model themselves: L-DAWA, FedLAW)."""

    def contribute(self, job: ClientJob) -> ClientVectors:
        return ClientVectors.of(job.flat.state_numpy(), job.client_id, job.num_train)


class GlobalModelServer(ServerHalf[P, C]):
    """A server half that keeps θ_g, the global model of the run's single architecture.

    It broadcasts :class:`GlobalModel` by default; ``aggregate`` is the subclass's rule.
    """

    @classmethod
    def validate(cls, params: P, spec: ProblemSpec) -> None:
        require_homogeneous(spec)

    def __init__(self, params: P, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)  # validates
        self.architecture = sole_architecture(spec)
        self.global_vector = np.array(initial[self.architecture], dtype=np.float32)

    def broadcast(self) -> Broadcast:
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
