"""FedAvg: the sample-size weighted average of the clients' models.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017, arXiv:1602.05629.

    θ_g ← Σ_{i∈U} n_i θ_i / Σ_{i∈U} n_i

over the set U of clients that uploaded this round, n_i = their training samples.
Floating-point buffers (BatchNorm running statistics) are averaged with the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rayfed.algorithms.base import (
    Broadcast,
    ClientHalf,
    NoParams,
    RoundContext,
    ServerHalf,
    SharedBody,
    register_algorithm,
)
from rayfed.algorithms.contributions import ClientVectors, WeightedSum
from rayfed.errors import ConfigError
from rayfed.problem import ProblemSpec

if TYPE_CHECKING:
    from rayfed.training import ClientJob

__all__ = ["GlobalModel", "WholeModels", "FedAvgServer", "require_homogeneous", "sole_architecture"]


@dataclass(frozen=True)
class GlobalModel(Broadcast):
    """One global model (parameters then buffers) that every client starts from."""

    vector: np.ndarray

    def personalise(self, job: ClientJob) -> None:
        job.flat.load_state(self.vector)

    def contribute(self, job: ClientJob) -> WeightedSum:
        return WeightedSum.of(job.flat.state_numpy(), job.num_train)

    def bytes_down(self, job: ClientJob) -> int:
        return int(self.vector.nbytes)

    def shared_body(self, jobs: Sequence[ClientJob]) -> SharedBody | None:
        """Every client is evaluated with the global model itself (a subclass whose ``prepare_eval``
        loads another model says so here)."""
        return SharedBody(self.vector)


@dataclass(frozen=True)
class WholeModels(GlobalModel):
    """The global model; a trained client sends its whole state as one row of a :class:`ClientVectors`
    (server halves that weigh each client's model themselves: L-DAWA, FedLAW)."""

    def contribute(self, job: ClientJob) -> ClientVectors:  # type: ignore[override]
        return ClientVectors.of(job.flat.state_numpy(), job.client_id, job.num_train)


def require_homogeneous(spec: ProblemSpec) -> str:
    """The single architecture of the run; algorithms that average whole models need one.

    A server half calls it in its ``validate``; its constructor, already validated, reads
    the architecture with :func:`sole_architecture`.
    """
    if not spec.homogeneous:
        raise ConfigError(
            f"algorithm.name={spec.algorithm or 'fedavg'!r} averages whole models and needs one architecture, but "
            f"model.client_models={sorted(spec.layouts)}; use 'fedclassavg' for heterogeneous clients"
        )
    return sole_architecture(spec)


def sole_architecture(spec: ProblemSpec) -> str:
    """The architecture of a run that :func:`require_homogeneous` accepted (the first one otherwise)."""
    return next(iter(spec.layouts))


class FedAvgServer(ServerHalf[object, WeightedSum]):
    """Keeps θ_g; aggregates by the weighted average of the uploaded models."""

    @classmethod
    def validate(cls, params: object, spec: ProblemSpec) -> None:
        require_homogeneous(spec)

    def __init__(self, params: object, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)  # validates
        self.global_vector = np.array(initial[sole_architecture(spec)], dtype=np.float32)

    def broadcast(self) -> GlobalModel:
        return GlobalModel(self.global_vector)

    def aggregate(self, ctx: RoundContext, contribution: WeightedSum | None) -> dict[str, float]:
        if contribution is None:
            return {"clients_aggregated": 0.0}
        self.global_vector = contribution.average()
        return {"clients_aggregated": float(contribution.count)}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"global": self.global_vector}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.global_vector = np.array(state["global"], dtype=np.float32)


register_algorithm(
    "fedavg",
    params=NoParams,
    server=FedAvgServer,
    client=ClientHalf,
    summary="FedAvg (McMahan et al. 2017): size-weighted average of full models",
    label="FedAvg",
)
