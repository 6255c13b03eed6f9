"""Clients that keep a model of their own between rounds: how each one's own initial model is drawn,
and how the model it trained is saved in, and read back from, its state.

Local-only training, Ditto, FedAMP, FedFomo, FedNH, FedProto, KT-pFL and FedClassAvg keep the
client's model in the engine's client state store under :data:`MODEL_KEY`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import numpy as np

from rayfed.models import InputShape, build_model, seeded_init
from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob
from rayfed.train.problem import ProblemSpec
from rayfed.util.seeding import init_seed

__all__ = [
    "MODEL_KEY",
    "CLIENT_INIT_STREAM",
    "ClientInit",
    "has_saved_model",
    "saved_model",
    "own_model_state",
    "save_model_state",
]

MODEL_KEY = "model"
"""Key of the client's model (parameters then buffers, ``FlatModel.state_numpy``) in its state."""

CLIENT_INIT_STREAM = 1 << 20
"""Client c's initialisation uses ``init_seed(seed, CLIENT_INIT_STREAM + c)``; streams below
are the per-architecture ones of ``rayfed.engine.problem_build.build_problem``."""


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
    """Persist the client's trained model in ``job.state`` (the engine stores it if the update is accepted): a
    copy on the device, which the worker reads back with the rest of its call."""
    job.state = {**(job.state or {}), MODEL_KEY: job.trained.clone()}
