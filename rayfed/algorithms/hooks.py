"""The contract every algorithm fulfils: a server half, a client half, the message between them, the upload.

Round t, as the engine runs it (``rayfed.engine``, ``rayfed.execution``)::

    message = server.broadcast()                         # on the server, ray.put once
    for each sampled client i (on a worker):
        client.personalise(message, job_i)               # its starting model, e.g. Eq. 7 of cwFedAvg
        the one loop trains client.phases(job_i)         # local objective, e.g. CE + WDR (rayfed.train.loop)
        c_i = client.contribute(message, job_i)          # what it sends
    contribution = c_1 + c_2 + ...                       # summed on the workers, then on the server
    server.aggregate(ctx, contribution)                  # e.g. Eq. 6 of cwFedAvg
    each evaluated client: client.prepare_eval(message', job), then accuracy on its own test split

* :class:`ServerHalf`: the server's state and its aggregation rule (and, as :class:`StateSizes`, what
  that state weighs).
* :class:`Broadcast`: the round's message. It carries the data every worker reads, *and* how a client
  reads it: its starting model (for a stack, all of them at once), and by default its upload and its
  evaluation model. That is the server's protocol, which a client half borrowed from another algorithm
  (``algorithm.client``) follows too.
* :class:`ClientHalf`: the whole client. It loads its starting model, declares its local training as
  phases (:class:`Phase`), which the one loop runs for every method, one client at a time or stacked,
  makes its upload and loads its evaluation model: as the message says, unless it adds its own
  (KT-pFL's predictions, FedBABU's fine-tuning).
* :class:`Contribution`: an upload with an associative, commutative ``+``, so workers sum their
  clients before returning and the server sums the rest.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from rayfed.algorithms.sizing import StateSizes
from rayfed.train.problem import ProblemSpec

if TYPE_CHECKING:  # the server never trains: torch is imported where clients train
    from rayfed.algorithms.figures import Figure, FinishedRun
    from rayfed.data.held_out import HeldOutRequest
    from rayfed.train.job import ClientJob
    from rayfed.train.phase import Phase

__all__ = ["RoundContext", "Contribution", "Broadcast", "SharedBody", "ClientHalf", "ServerHalf", "NoParams"]

P = TypeVar("P")
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


class Contribution(abc.ABC):
    """An upload that adds: ``(a + b) + c == a + (b + c)`` and ``a + b == b + a`` up to float rounding.

    A contribution may live on a worker's device (a GPU) while the worker sums a call's contributions there;
    the sum comes to the host once (:meth:`device_tensors`, :meth:`with_host_arrays`). A sum is finite only
    when every part is: the worker checks the call's sum, and the parts only when it is not.
    """

    sum_is_one_part: ClassVar[bool] = True
    """True if a sum of parts takes the bytes of one part (a sum, not a concatenation). The summation tree adds
    and joins alike (:mod:`rayfed.execution.summation`): a node's joined rows are as large as its calls' parts."""

    @abc.abstractmethod
    def __add__(self, other: Any) -> Contribution: ...

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes this contribution would take on the wire."""

    @abc.abstractmethod
    def is_finite(self) -> Any:
        """False if any value is NaN or infinite (such an update is never aggregated): a bool, or a 0-d bool
        tensor while the contribution lives on a device."""

    def device_tensors(self) -> list[Any]:
        """The tensors of this contribution that live on a device; none for one held in host memory."""
        return []

    def with_host_arrays(self, arrays: Sequence[np.ndarray]) -> Contribution:
        """This contribution with :meth:`device_tensors` replaced by ``arrays``, their host copies in order."""
        return self


class Broadcast(abc.ABC):
    """The server's message for one round, with how a client reads it. Picklable and cheap to share: Ray
    stores it once and every worker reads the same object, zero-copy for its numpy arrays."""

    eval_needs_train: ClassVar[bool] = False
    """True if evaluation reads the client's training split (FedBABU fine-tunes on it, IFCA picks its
    cluster by training loss), so evaluation jobs carry it."""

    @abc.abstractmethod
    def personalise(self, job: ClientJob) -> None:
        """Load the client's starting model for this round into ``job.flat``."""

    @abc.abstractmethod
    def contribute(self, job: ClientJob) -> Contribution:
        """What the client trained in ``job.flat`` sends to the server."""

    def prepare_eval(self, job: ClientJob) -> None:
        """Load the model the client is evaluated with; by default its personalised model."""
        self.personalise(job)

    def prepare_global_eval(self, job: ClientJob) -> bool:
        """Load the run's global model into ``job.flat`` and return True, if the algorithm has one besides the
        models it evaluates (False by default: FedAvg's evaluated model is its global model). ``job`` stands for
        all clients together: no client id (-1), no state, label counts summed over every client."""
        return False

    def bytes_down(self, job: ClientJob) -> int:
        """Bytes the client receives this round; by default its whole model."""
        return job.flat.size * 4

    def shared_body(self, jobs: Sequence[ClientJob]) -> SharedBody | None:
        """The evaluation models of ``jobs`` (one architecture) when they share everything but the output
        layer, so the worker runs the body once over all their test samples; None (the default) otherwise."""
        return None

    def personalise_stacked(self, jobs: Sequence[ClientJob]) -> Any:
        """The starting states of ``jobs`` as one (C, S) tensor on their device, when the message forms them at
        once (a global model they all start from); None (the default) personalises them one by one."""
        return None

    def contribute_stacked(self, jobs: Sequence[ClientJob], states: Any) -> Contribution | None:
        """What ``jobs`` send, summed in one operation from their trained states (C, S) on the device, equal to
        the sum of their :meth:`contribute` up to float rounding; None (the default) contributes one by one."""
        return None


@dataclass(frozen=True)
class SharedBody:
    """Evaluation models that differ at most in the output layer: ``state`` outside it, and each client's
    output layer ``weight`` (C, K, h) and ``bias`` (C, K), or None when every client uses ``state`` whole."""

    state: np.ndarray
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None


class ClientHalf(Generic[P]):
    """The client's side of a round: its local training, its upload and its evaluation model.

    Local training is declared, never written as a loop: :meth:`phases` lists what the client trains (by
    default FedAvg's one phase of ``train.local_epochs`` epochs of SGD on cross-entropy), with its loss
    term and hooks as pure functions of one client's tensors (:mod:`rayfed.train.phase`). The loop runs
    the phases of every method stacked and replayed, so a method is on the fast path by construction.
    ``phases`` reads the job's data, state and scratch, never its model: the model it starts from is the
    phase's ``constants["start"]`` (``Phase.needs_start``).
    """

    normalized_features: ClassVar[bool] = False
    """True if the client's output layer reads L2-normalised features (FedNH's cosine classifier): the
    worker builds its models so (:func:`rayfed.models.layers.normalize_inputs_of`)."""

    def __init__(self, params: P, spec: ProblemSpec) -> None:
        self.params = params
        self.spec = spec

    def personalise(self, message: Broadcast, job: ClientJob) -> None:
        """Load the client's starting model for this round into ``job.flat``; by default as the message says."""
        message.personalise(job)

    def personalise_stacked(self, message: Broadcast, jobs: Sequence[ClientJob]) -> Any:
        """The starting states of ``jobs`` as one (C, S) tensor, or None to :meth:`personalise` them one by one;
        by default as the message says. A client half that overrides :meth:`personalise` makes this agree
        with it (None does)."""
        return message.personalise_stacked(jobs)

    def phases(self, job: ClientJob) -> list[Phase]:
        """The client's local training this round."""
        from rayfed.train.phase import Phase  # torch: imported where clients train, not by the server

        return [Phase(epochs=job.train.local_epochs)]

    def contribute(self, message: Broadcast, job: ClientJob) -> Contribution:
        """What the client, trained in ``job.flat``, sends; by default as the message says."""
        return message.contribute(job)

    def contribute_stacked(self, message: Broadcast, jobs: Sequence[ClientJob], states: Any) -> Contribution | None:
        """What a stack of clients sends, summed at once from their trained states (C, S), or None to
        :meth:`contribute` one by one; by default as the message says. A client half that overrides
        :meth:`contribute` makes this agree with it (None does)."""
        return message.contribute_stacked(jobs, states)

    def prepare_eval(self, message: Broadcast, job: ClientJob) -> list[Phase]:
        """Load the model the client is evaluated with and return the phases to train on it first (a
        fine-tuning, FedBABU's), none by default; the model is as the message says."""
        message.prepare_eval(job)
        return []


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
    def broadcast(self) -> Broadcast:
        """The message of the next round (a function of the server's state only)."""

    @abc.abstractmethod
    def aggregate(self, ctx: RoundContext, contribution: C | None) -> dict[str, float]:
        """Fold the round's summed contribution into the state; None means no acceptable update, and the state
        stays as it is. Returns metrics."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume, as named numpy arrays (saved without pickle)."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None: ...
