"""Local-only training: every client trains its own model and nothing is aggregated.

The "local only" baseline of the personalised-FL papers (e.g. FedClassAvg, ICPP 2022,
Table 2; docs/algorithms.md, local training section). Each client starts from its *own*
random initialisation, drawn from (run seed, client id), so clients are independent, as
they would be without any federation; it then trains with the client half (plain SGD on
cross-entropy unless ``algorithm.client`` borrows another one) whenever it is sampled,
and its model stays in the engine's client state store between rounds. Evaluation uses
the model the client holds: its last trained one, or its initialisation if it never trained.

Nothing travels: uploads and downloads are 0 bytes.

The per-client initialisation (:class:`ClientInit`) and the persisted model
(:func:`save_model_state`, :func:`own_model_state`) are shared with FedClassAvg, whose
clients also keep their own model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import numpy as np

from rayfed.algorithms.base import (
    Broadcast,
    ClientHalf,
    Contribution,
    NoParams,
    RoundContext,
    ServerHalf,
    register_algorithm,
)
from rayfed.flat import FlatModel
from rayfed.models import build_model, seeded_init
from rayfed.models._spec import InputShape
from rayfed.problem import ProblemSpec
from rayfed.seeding import init_seed
from rayfed.training import ClientJob

__all__ = [
    "ClientInit",
    "NoUpload",
    "OwnModels",
    "LocalServer",
    "own_model_state",
    "save_model_state",
    "has_saved_model",
    "saved_model",
]

MODEL_KEY = "model"
"""Key of the client's model (parameters then buffers, ``FlatModel.state_numpy``) in its state."""

CLIENT_INIT_STREAM = 1 << 20
"""Client c's initialisation uses ``init_seed(seed, CLIENT_INIT_STREAM + c)``; streams below
are the per-architecture ones of ``rayfed.problem_build.build_problem``."""


@dataclass(frozen=True)
class ClientInit:
    """How a client's own initial model is drawn: the registered model, seeded by (run seed, client id)."""

    seed: int
    input_shape: InputShape
    num_classes: int

    @classmethod
    def of(cls, spec: ProblemSpec) -> ClientInit:
        return cls(spec.seed, spec.input_shape, spec.num_classes)

    def state(self, architecture: str, client_id: int) -> np.ndarray:
        """Client ``client_id``'s initial parameters and buffers (``state_numpy`` layout).

        The model is built afresh with torch's global generator forked and seeded, so
        the result depends only on (seed, architecture, client id) and the caller's
        random stream is untouched.
        """
        with seeded_init(init_seed(self.seed, CLIENT_INIT_STREAM + client_id)):
            module = build_model(architecture, self.input_shape, self.num_classes)
        return FlatModel(module).state_numpy()


def has_saved_model(job: ClientJob) -> bool:
    """Whether the client has persisted a model with :func:`save_model_state` (it has trained)."""
    return job.state is not None and MODEL_KEY in job.state


def saved_model(job: ClientJob, default: np.ndarray) -> np.ndarray:
    """The model the client persisted when it last trained, else ``default`` (e.g. the common initial model)."""
    return _saved(job) if has_saved_model(job) else default


def own_model_state(job: ClientJob, init: ClientInit) -> np.ndarray:
    """The model client ``job.client_id`` holds: its persisted one, else its own initialisation (built
    only when needed)."""
    return _saved(job) if has_saved_model(job) else init.state(job.architecture, job.client_id)


def _saved(job: ClientJob) -> np.ndarray:
    return cast("Mapping[str, np.ndarray]", job.state)[MODEL_KEY]


def save_model_state(job: ClientJob) -> None:
    """Persist the client's trained model in ``job.state`` (the engine stores it if the update is accepted)."""
    state = dict(job.state or {})
    state[MODEL_KEY] = job.flat.state_numpy()
    job.state = state


@dataclass
class NoUpload(Contribution):
    """An empty upload that only counts the clients that trained."""

    count: int = 1

    def __add__(self, other: NoUpload) -> NoUpload:
        return NoUpload(self.count + other.count)

    def __iadd__(self, other: NoUpload) -> NoUpload:
        self.count += other.count
        return self

    @property
    def nbytes(self) -> int:
        return 0

    def is_finite(self) -> bool:
        return True


@dataclass(frozen=True)
class OwnModels(Broadcast):
    """The (empty) message of local-only training: each client loads its own model."""

    init: ClientInit

    def personalise(self, job: ClientJob) -> None:
        job.flat.load_state(own_model_state(job, self.init))

    def contribute(self, job: ClientJob) -> NoUpload:
        save_model_state(job)
        return NoUpload()

    def bytes_down(self, job: ClientJob) -> int:
        return 0


class LocalServer(ServerHalf[NoParams, NoUpload]):
    """Holds nothing; counts the clients that trained."""

    def __init__(self, params: NoParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        self.message = OwnModels(ClientInit.of(spec))

    def broadcast(self) -> OwnModels:
        return self.message

    def aggregate(self, ctx: RoundContext, contribution: NoUpload | None) -> dict[str, float]:
        return {"clients_trained": float(contribution.count if contribution is not None else 0)}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        return None


register_algorithm(
    "local",
    params=NoParams,
    server=LocalServer,
    client=ClientHalf,
    summary="Local-only training: each client trains its own model, kept in the client state store; no aggregation",
    keeps_client_state=True,
    label="Local",
)
