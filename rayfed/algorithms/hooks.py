"""The contract every algorithm fulfils: a server half, a client half, the message between them, the upload.

Round t, as the engine runs it (``rayfed.engine``, ``rayfed.execution``)::

    message = server.broadcast()                     # data, on the server; Ray stores it once
    for each sampled client i (on a worker):
        job_i.start = client.start(message, job_i)   # its starting model, e.g. Eq. 7 of cwFedAvg
        the one loop trains client.phases(message, job_i)    # local objective, e.g. CE + WDR (rayfed.train.loop)
        c_i = client.upload(message, job_i)          # what it sends, from the trained model (and job_i.state:
                                                     # what it keeps for its next round)
    contribution = c_1 + c_2 + ...                   # summed on the workers, then on the server
    server.aggregate(ctx, contribution)              # e.g. Eq. 6 of cwFedAvg (a round without one keeps the state)
    each evaluated client: client.evaluation(message', job), then (client.fine_tuning) accuracy on its own test split

* :class:`ServerHalf`: the server's state, its message (:meth:`ServerHalf.broadcast`: plain data, e.g. a frozen
  dataclass of numpy arrays) and its aggregation rule.
* :class:`ClientHalf`: the whole client. From the message it reads, it makes its starting model, declares its
  local training as phases (:class:`~rayfed.train.phase.Phase`), which the one loop runs for every method, one
  client at a time or stacked, makes its upload and its evaluation model. Each of these is written for one
  client; the loop forms stacks of clients itself.
* :class:`Contribution`: an upload with an associative, commutative ``+``, so workers sum their clients before
  returning and the server sums the rest.

What a method may declare beside these (a shared body to evaluate once, held-out server data, its state's size)
is opt-in (:mod:`rayfed.algorithms.declarations`, :mod:`rayfed.algorithms.sizing`); what only reports read (its
label, its figures) is declared when it registers (:class:`~rayfed.algorithms.registry.Reporting`). docs/methods.md
is the page for method authors.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from rayfed.algorithms.contributions import Contribution, WeightedState
from rayfed.train.problem import ProblemSpec

if TYPE_CHECKING:  # the server never trains: torch is imported where clients train
    from rayfed.train.job import ClientJob
    from rayfed.train.phase import Phase

__all__ = [
    "RoundContext",
    "Contribution",
    "Start",
    "HELD_BY_CLIENTS",
    "message_bytes",
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
    """The facts of one round an author reads, decided once by the engine; the workers build every client's job from
    them. What the engine's system model and privacy decide beside them (a client's step budget, an update's arrival,
    the round's clip norm) travels on the engine's own value, :class:`rayfed.execution.round_facts.RoundFacts`."""

    round: int
    """0-based; -1 for the evaluation of the initial model (``engine.eval_initial``)."""
    seed: int
    """The run's seed: with the round and a client's id, it seeds the client's batches."""
    lr: float
    """The round's learning rate of local training (``train.lr_at(round)``)."""
    sampled: np.ndarray
    """Ids of the clients that train this round, sorted."""


@dataclass
class Start:
    """What a client starts its round from (:meth:`ClientHalf.start`): ``model``, its state (parameters then
    buffers, as a numpy array or a tensor on its device). A client half whose start decides more than the model
    returns a subclass carrying it (IFCA: the cluster it chose), and finds it again as ``job.start`` in its
    ``phases`` and ``upload``. The same array for every client (a global model) lets a stack start from one copy.
    The worker reads ``model`` again once the client has trained (the update's norm), so it stays as it was."""

    model: Any


HELD_BY_CLIENTS: Mapping[str, bool] = MappingProxyType({"rayfed.held_by_clients": True})
"""The metadata of a message field that every client already holds, so that its download does not count it
(``field(metadata=HELD_BY_CLIENTS)``): the common initialisation a client starts its own model from (Ditto's,
FedPer's head), or what each client decided itself (IFCA's last chosen clusters)."""


def message_bytes(message: Any) -> int:
    """Bytes of the arrays a message carries, through nested dataclasses and tuples, less the fields marked
    :data:`HELD_BY_CLIENTS`: what a client downloads when it receives the message whole. Numbers and layouts
    (a few bytes, the same every round) are not counted."""
    if isinstance(message, np.ndarray):
        return int(message.nbytes)
    if isinstance(message, tuple | list):
        return sum(message_bytes(item) for item in message)
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        return sum(
            message_bytes(getattr(message, f.name))
            for f in dataclasses.fields(message)
            if f.metadata != HELD_BY_CLIENTS
        )
    return 0


class ClientHalf(abc.ABC, Generic[P, M]):
    """The whole client of a round: its start, its local training, its upload and its evaluation model, each
    for one client (``job``) and read from the round's message ``M``.

    Local training is declared, never written as a loop: :meth:`phases` lists what the client trains (by
    default FedAvg's one phase of ``train.local_epochs`` epochs of SGD on cross-entropy), with its loss term and
    hooks as pure functions of one client's tensors (:mod:`rayfed.train.phase`). The loop runs the phases of
    every method stacked and replayed, so a method is on the fast path by construction; every phase is checked
    before it trains (:mod:`rayfed.train.phase_checks`).
    """

    def __init__(self, params: P, spec: ProblemSpec) -> None:
        self.params = params
        self.spec = spec

    @abc.abstractmethod
    def start(self, message: M, job: ClientJob) -> Start:
        """The client's start this round: its starting model, and what else it made of the message
        (:class:`Start`)."""

    def phases(self, message: M, job: ClientJob) -> list[Phase]:
        """The client's local training this round; ``job.start`` holds what :meth:`start` returned."""
        from rayfed.train.phase import Phase  # torch: imported where clients train, not by the server

        return [Phase(epochs=job.train.local_epochs)]

    @abc.abstractmethod
    def upload(self, message: M, job: ClientJob) -> Contribution | WeightedState:
        """What the client sends, from its trained model (``job.trained``, its state; ``job.model``, the module)
        and ``job.extra``; tensors on the device are read back once with the rest of the call. FedAvg's upload is
        declared (:class:`~rayfed.algorithms.contributions.WeightedState`): the worker then makes a stack's at
        once.

        It is also where the client saves what it keeps for its next round, in a method registered with
        ``keeps_client_state``: ``job.state`` as it stands after ``upload`` is stored (a dict of arrays or
        device tensors; assign a new dict, e.g. ``job.state = {**(job.state or {}), "model": job.trained.clone()}``,
        and leave the arrays of the old one as they are). What the phases keep (a :class:`~rayfed.train.phase.Kept`
        model, ``SGD(keep_momentum=...)``) is already in it. ``upload`` must not change ``job.trained``."""

    def evaluation(self, message: M, job: ClientJob) -> Any:
        """The model the client is evaluated with (a state, as :meth:`start`); by default its starting one."""
        return self.start(message, job).model

    def fine_tuning(self, message: M, job: ClientJob) -> list[Phase]:
        """Phases trained on the evaluation model before it is evaluated (FedBABU's); none by default."""
        return []

    def global_model(self, message: M, job: ClientJob) -> Any | None:
        """The run's global model, if the algorithm has one besides the models it evaluates (None by default:
        FedAvg's evaluated model is its global model). ``job`` stands for all clients together: no client id
        (-1), no state, label counts summed over every client."""
        return None

    def bytes_down(self, message: M, job: ClientJob) -> int:
        """Bytes the client receives this round (the run's ``bytes_down``); by default the whole message
        (:func:`message_bytes`). A client that receives part of it (its own row, the models it chooses) says
        so here."""
        return message_bytes(message)


class ServerHalf(abc.ABC, Generic[P, C]):
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

    @abc.abstractmethod
    def broadcast(self) -> Any:
        """The message of the next round: plain data (a function of the server's state only)."""

    @abc.abstractmethod
    def aggregate(self, ctx: RoundContext, contribution: C) -> dict[str, float]:
        """Fold the round's summed contribution into the state; returns metrics. It is called only with one:
        a round without an acceptable update keeps the state as it is, and the server answers it for every
        method (``clients_aggregated`` = 0)."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume, as named numpy arrays (saved without pickle)."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` returned (a resumed run's server)."""
