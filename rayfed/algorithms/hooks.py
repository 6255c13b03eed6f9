"""The contract every algorithm fulfils: a server half, a client half, the message between them, the upload.

Round t, as the engine runs it (``rayfed.engine``, ``rayfed.execution``)::

    message = server.broadcast()                     # data, on the server; Ray stores it once
    for each sampled client i (on a worker):
        client.start(message, job_i)                 # its starting model, e.g. Eq. 7 of cwFedAvg
        the one loop trains client.phases(message, job_i)    # local objective, e.g. CE + WDR (rayfed.train.loop)
        c_i = client.upload(message, job_i)          # what it sends, from the trained model in job_i.flat
    contribution = c_1 + c_2 + ...                   # summed on the workers, then on the server
    server.aggregate(ctx, contribution)              # e.g. Eq. 6 of cwFedAvg
    each evaluated client: client.evaluation(message', job), then (client.fine_tuning) accuracy on its own test split

* :class:`ServerHalf`: the server's state, its message (:meth:`ServerHalf.broadcast`: plain data, e.g. a frozen
  dataclass of numpy arrays) and its aggregation rule (and, as :class:`StateSizes`, what that state weighs).
* :class:`ClientHalf`: the whole client. From the message it reads, it makes its starting model, declares its
  local training as phases (:class:`~rayfed.train.phase.Phase`), which the one loop runs for every method, one
  client at a time or stacked, makes its upload and its evaluation model. Each of these is written for one
  client; the loop forms stacks of clients itself.
* :class:`Contribution`: an upload with an associative, commutative ``+``, so workers sum their clients before
  returning and the server sums the rest.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from rayfed.algorithms.contributions import Contribution, WeightedState
from rayfed.algorithms.sizing import StateSizes
from rayfed.train.problem import ProblemSpec

if TYPE_CHECKING:  # the server never trains: torch is imported where clients train
    from rayfed.algorithms.figures import Figure, FinishedRun
    from rayfed.data.held_out import HeldOutRequest
    from rayfed.train.job import ClientJob
    from rayfed.train.phase import Phase

__all__ = [
    "RoundContext",
    "Contribution",
    "Start",
    "model_of",
    "SharedBody",
    "ClientHalf",
    "ServerHalf",
    "NoParams",
]

P = TypeVar("P")
M = TypeVar("M")
C = TypeVar("C", bound="Contribution")


@dataclass(frozen=True)
class NoParams:
    """Hyper-parameters of an algorithm that has none (FedAvg)."""


@dataclass(frozen=True)
class RoundContext:
    """The facts of one round, decided once by the engine; the workers build every client's job from them."""

    round: int
    """0-based; -1 for the evaluation of the initial model (``engine.eval_initial``)."""
    seed: int
    """The run's seed: with the round and a client's id, it seeds the client's batches."""
    lr: float
    """The round's learning rate of local training (``train.lr_at(round)``)."""
    sampled: np.ndarray
    """Ids of the clients that train this round, sorted."""
    step_budget: np.ndarray | None = None
    """With a system model's partial work (``system.late_work="partial"``, :mod:`rayfed.system.rounds`): int64, one
    per sampled client, the local steps it takes before it must upload (-1: all its phases' steps); None: all."""
    arrives_at: np.ndarray | None = None
    """Asynchronous aggregation (:mod:`rayfed.system.schedule`): int64, one per sampled client, the model version
    its update is applied to make (the round is the version it trains from); None in synchronous rounds."""

    def budget_of(self, client_id: int) -> int | None:
        """The local steps client ``client_id`` may take this round, or None for all (:attr:`step_budget`)."""
        if self.step_budget is None:
            return None
        budget = int(self.step_budget[np.searchsorted(self.sampled, client_id)])
        return None if budget < 0 else budget


@dataclass
class Start:
    """A client's starting model (``model``: its state, parameters then buffers, as a numpy array or a tensor on
    its device), with what the client made of the message for its phases and upload to read: a client half
    whose :meth:`ClientHalf.start` decides more than the model returns a subclass (IFCA: the cluster it chose),
    and finds it again as ``job.start``."""

    model: Any


def model_of(start: Any) -> Any:
    """The starting state a :meth:`ClientHalf.start` returned: its ``model`` if it is a :class:`Start`."""
    return start.model if isinstance(start, Start) else start


@dataclass(frozen=True)
class SharedBody:
    """Evaluation models that differ at most in the output layer: ``state`` outside it, and each client's
    output layer ``weight`` (C, K, h) and ``bias`` (C, K), or None when every client uses ``state`` whole."""

    state: np.ndarray
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None


class ClientHalf(abc.ABC, Generic[P, M]):
    """The whole client of a round: its start, its local training, its upload and its evaluation model, each
    for one client (``job``) and read from the round's message ``M``.

    Local training is declared, never written as a loop: :meth:`phases` lists what the client trains (by
    default FedAvg's one phase of ``train.local_epochs`` epochs of SGD on cross-entropy), with its loss term and
    hooks as pure functions of one client's tensors (:mod:`rayfed.train.phase`). The loop runs the phases of
    every method stacked and replayed, so a method is on the fast path by construction; every phase is checked
    before it trains (:mod:`rayfed.train.phase_checks`).
    """

    normalized_features: ClassVar[bool] = False
    """True if the client's output layer reads L2-normalised features (FedNH's cosine classifier): the
    worker builds its models so (:func:`rayfed.models.layers.normalize_inputs_of`)."""
    eval_reads_train: ClassVar[bool] = False
    """True if :meth:`evaluation` or :meth:`fine_tuning` read the client's training split (FedBABU fine-tunes on
    it, IFCA picks its cluster by training loss), so evaluation jobs carry it."""

    def __init__(self, params: P, spec: ProblemSpec) -> None:
        self.params = params
        self.spec = spec

    @abc.abstractmethod
    def start(self, message: M, job: ClientJob) -> Any:
        """The client's starting model this round (its state, parameters then buffers, as a numpy array or a
        tensor), or a :class:`Start` carrying it. Returning the same array for every client (a global model)
        lets a stack start from one copy."""

    def phases(self, message: M, job: ClientJob) -> list[Phase]:
        """The client's local training this round; ``job.start`` holds what :meth:`start` returned."""
        from rayfed.train.phase import Phase  # torch: imported where clients train, not by the server

        return [Phase(epochs=job.train.local_epochs)]

    @abc.abstractmethod
    def upload(self, message: M, job: ClientJob) -> Contribution | WeightedState:
        """What the client sends, from its trained model (``job.trained``, its state; ``job.model``, the module)
        and ``job.extra``; tensors on the device are read back once with the rest of the call. FedAvg's upload is
        declared (:class:`~rayfed.algorithms.contributions.WeightedState`): the worker then makes a stack's at
        once."""

    def evaluation(self, message: M, job: ClientJob) -> Any:
        """The model the client is evaluated with (a state, as :meth:`start`); by default its starting one."""
        return model_of(self.start(message, job))

    def fine_tuning(self, message: M, job: ClientJob) -> list[Phase]:
        """Phases trained on the evaluation model before it is evaluated (FedBABU's); none by default."""
        return []

    def global_model(self, message: M, job: ClientJob) -> Any | None:
        """The run's global model, if the algorithm has one besides the models it evaluates (None by default:
        FedAvg's evaluated model is its global model). ``job`` stands for all clients together: no client id
        (-1), no state, label counts summed over every client."""
        return None

    def bytes_down(self, message: M, job: ClientJob) -> int:
        """Bytes the client receives this round; by default its whole model."""
        return job.worker_model.size * 4

    def shared_body(self, message: M, jobs: Sequence[ClientJob]) -> SharedBody | None:
        """The evaluation models of ``jobs`` (one architecture) when they share everything but the output
        layer, so the worker runs the body once over all their test samples; None (the default) otherwise."""
        return None


class ServerHalf(StateSizes, abc.ABC, Generic[P, C]):
    """The server's state and aggregation rule; lives in the ``ServerActor``. ``initial`` maps each
    architecture to its common initial state (all clients of an architecture start from it)."""

    def __init__(self, params: P, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        type(self).validate(params, spec)
        self.params = params
        self.spec = spec

    @classmethod
    def validate(cls, params: P, spec: ProblemSpec) -> None:
        """The one check of ``params`` against the problem; raise ConfigError naming the field. The engine
        calls it before anything is written, and the constructor again; nothing to check by default."""

    @classmethod
    def held_out(cls, params: P, spec: ProblemSpec) -> HeldOutRequest | None:
        """The server data no client may own (FedLAW's proxy set, KT-pFL's public set), carved out of the pool
        before the partition and handed over as ``spec.held_out``; None by default."""
        return None

    @classmethod
    def figures(cls, params: P, run: FinishedRun) -> list[Figure]:
        """The figures this method draws from a finished run (``rayfed plot``), as data; none by default."""
        return []

    @abc.abstractmethod
    def broadcast(self) -> Any:
        """The message of the next round: plain data (a function of the server's state only)."""

    @abc.abstractmethod
    def aggregate(self, ctx: RoundContext, contribution: C | None) -> dict[str, float]:
        """Fold the round's summed contribution into the state; None means no acceptable update, and the state
        stays as it is. Returns metrics."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume, as named numpy arrays (saved without pickle)."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None: ...
