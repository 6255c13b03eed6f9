"""The contract every algorithm fulfils: a client half and a server half.

Round t, as the engine runs it (``rayfed.engine``)::

    broadcast = server_half.broadcast()                     # on the server, ray.put once
    for each sampled client i (on a worker):
        broadcast.personalise(job_i)                        # starting point, e.g. Eq. 7 of cwFedAvg
        client_half.train(job_i)                            # local objective, e.g. CE + WDR
        c_i = broadcast.contribute(job_i)                   # what the client sends
    contribution = c_1 + c_2 + ...                          # partly on workers, the rest on the server
    server_half.aggregate(ctx, contribution)                # e.g. Eq. 6 of cwFedAvg
    for each evaluated client: broadcast'.prepare_eval(job) # then accuracy on its own test split
    broadcast'.prepare_global_eval(all_clients)             # the global model, if any, on the same splits

* :class:`ClientHalf`: what local training adds (a loss term, or its own loop).
* :class:`ServerHalf`: the server's state and how it aggregates.
* :class:`Broadcast`: the round's message from the server. It carries the data every
  worker reads (``ray.put`` once per round) *and* the worker-side half of the server's
  logic: how a client's starting model is formed from it, and what a trained client
  contributes. Personalisation thus runs on the workers, close to the clients.
* :class:`Contribution`: an upload with an associative, commutative ``+``, so workers
  sum their clients before returning (local aggregation) and the server sums the rest.
"""


from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from rayfed.train.problem import ProblemSpec
from rayfed.train.scratch import ScratchKey

if TYPE_CHECKING:  # the server never trains: torch is imported where clients train
    from rayfed.algorithms.figures import Figure, FinishedRun
    from rayfed.config import TrainConfig
    from rayfed.data.held_out import HeldOutRequest
    from rayfed.train.job import ClientJob, TrainStats

__all__ = [
    "RoundContext",
    "Contribution",
    "Broadcast",
    "SharedBody",
    "ClientHalf",
    "ServerHalf",
    "NoParams",
    "model_state_bytes",
    "parameter_bytes",
    "buffer_bytes",
    "momentum_bytes",
]

P = TypeVar("P")
C = TypeVar("C", bound="Contribution")

_LOSS_CONSTANTS = ScratchKey[Mapping[str, Any]]("loss_constants")
"""``job.scratch`` key: :meth:`ClientHalf.loss_constants` of the job being trained, set by run_local_sgd."""


@dataclass(frozen=True)
class NoParams:
    """Hyper-parameters of an algorithm that has none (FedAvg)."""


@dataclass(frozen=True)
class RoundContext:
    """The facts of one round, decided once by the engine: the workers build every client's job from
    them (:class:`~rayfed.train.job.ClientJob`), the server half reads the round."""

    round: int
    """0-based; -1 for the evaluation of the initial model (``engine.eval_initial``)."""
    seed: int
    """The run's seed (``RunConfig.seed``): with the round and a client's id, it seeds the client's batches."""
    lr: float
    """The round's learning rate of local SGD (``train.lr_at(round)``)."""
    sampled: np.ndarray
    """Ids of the clients that train this round, sorted."""


class Contribution(abc.ABC):
    """An upload that adds: ``(a + b) + c == a + (b + c)`` and ``a + b == b + a`` up to float rounding.

    A worker may build contributions that still live on its device (a GPU): it sums a call's
    contributions there and brings the sum to the host once (:meth:`device_tensors`,
    :meth:`with_host_arrays`). A sum must be finite only when every part is (sums and
    concatenations are): the worker checks the call's sum, and the parts only when it is not.
    """

    @abc.abstractmethod
    def __add__(self, other: Any) -> Contribution: ...

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes this contribution would take on the wire."""

    @abc.abstractmethod
    def is_finite(self) -> Any:
        """False if any value is NaN or infinite (such an update is rejected, never aggregated): a bool, or a
        0-d bool tensor while the contribution lives on a device."""

    def device_tensors(self) -> list[Any]:
        """The tensors of this contribution that live on a worker's device; none (the default) for one
        held in host memory."""
        return []

    def with_host_arrays(self, arrays: Sequence[np.ndarray]) -> Contribution:
        """This contribution with :meth:`device_tensors` replaced by ``arrays``, their host copies in order."""
        return self


class Broadcast(abc.ABC):
    """The server's message for one round, with the worker-side half of its logic.

    It must be picklable and cheap to share: Ray stores it once and every worker
    reads the same object, zero-copy for its numpy arrays.
    """

    eval_needs_train: bool = False
    """True if :meth:`prepare_eval` reads the client's training split (FedBABU fine-tunes on it, IFCA picks
    its cluster by training loss), so evaluation jobs carry the train split too."""

    @abc.abstractmethod
    def personalise(self, job: ClientJob) -> None:
        """Load the client's starting model for this round into ``job.flat``."""

    @abc.abstractmethod
    def contribute(self, job: ClientJob) -> Contribution:
        """What the trained client sends to the server."""

    def prepare_eval(self, job: ClientJob) -> None:
        """Load the model the client is evaluated with; by default its personalised model."""
        self.personalise(job)

    def prepare_global_eval(self, job: ClientJob) -> bool:
        """Load the run's global model into ``job.flat`` and return True, if the algorithm has one
        besides the models it evaluates; by default it has none (False): FedAvg's evaluated model is
        its global model. ``job`` stands for all clients together: no client id (-1), no state, and
        label counts summed over every client, so a model personalised by class distribution (Eq. 7
        of cwFedAvg) is formed for the clients' overall distribution. The worker evaluates it on each
        evaluated client's test split beside the client's own model."""
        return False

    def bytes_down(self, job: ClientJob) -> int:
        """Bytes the client receives this round; by default its whole model."""
        return job.flat.size * 4

    def personalise_stacked(self, jobs: Sequence[ClientJob]) -> Any:
        """The starting states (parameters, then floating-point buffers) of ``jobs``, clients of one
        architecture trained stacked, as one (C, S) tensor on their device, when this broadcast forms
        them all at once (a global model they all start from); ``None`` (the default) to
        :meth:`personalise` them one by one."""
        return None

    def contribute_stacked(self, jobs: Sequence[ClientJob], states: Any) -> Contribution | None:
        """What the stacked clients ``jobs`` send, summed in one operation, from their trained states
        (C, S) on the device; ``None`` (the default) to :meth:`contribute` them one by one. It must
        equal the sum of their :meth:`contribute` up to float rounding, and weigh on the wire what
        each client's own contribution weighs (a weighted sum does)."""
        return None

    def shared_body(self, jobs: Sequence[ClientJob]) -> SharedBody | None:
        """The evaluation models of ``jobs`` (clients of one architecture, without data), when they
        share everything but the output layer; ``None`` (the default) when each client needs its own
        full model. Then the worker runs the shared body once over all their test samples and applies
        each client's output layer as a batched matrix product, instead of a forward per client."""
        return None


@dataclass(frozen=True)
class SharedBody:
    """Evaluation models that differ at most in the output layer (a linear map to the K classes).

    ``state`` is the state vector every client's evaluation model shares outside the output
    layer (whatever it holds there is not read); ``weight`` (C, K, h) and ``bias`` (C, K) are
    the output layers of the C clients, in the order of the jobs they were made for. Without
    them (None), every client is evaluated with ``state`` itself, output layer included (FedAvg's
    global model), and the worker runs that one model over all their test samples at once.
    """

    state: np.ndarray
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None


class ClientHalf(Generic[P]):
    """What local training adds. By default: plain SGD on cross-entropy (FedAvg's client).

    A loss term is written once, functionally, so that the sequential loop and the
    vectorised one (:mod:`rayfed.train.stacked`) share one formula:

    * :meth:`loss_constants` returns the per-client tensors the term reads (FedProx's
      anchor, WDR's p_i), computed after personalisation;
    * :meth:`functional_extra_loss` maps (parameter tensors in layout order, constants)
      to the term added to every mini-batch's loss, or ``None``.

    A client half with a loop of its own (FedClassAvg's two-view loss) overrides
    :meth:`train` instead and is then always trained sequentially.
    """

    def __init__(self, params: P, spec: ProblemSpec) -> None:
        self.params = params
        self.spec = spec

    def loss_constants(self, job: ClientJob) -> dict[str, Any]:
        """Per-client tensors for :meth:`functional_extra_loss`; none by default."""
        return {}

    def functional_extra_loss(self, params: list[Any], constants: Mapping[str, Any]) -> Any:
        """The term added to each mini-batch's loss; ``None`` (the default) adds nothing."""
        return None

    def extra_loss(self, job: ClientJob, logits: Any) -> Any:
        """The sequential loop's hook: the functional term on the model's live parameters."""
        return self.functional_extra_loss(job.flat.params, job.scratch[_LOSS_CONSTANTS])  # set by run_local_sgd

    def train(self, job: ClientJob) -> TrainStats:
        """Train ``job.model`` in place; by default :meth:`run_local_sgd`."""
        return self.run_local_sgd(job)

    def run_local_sgd(self, job: ClientJob, *, momentum_buffer: Any = None) -> TrainStats:
        """The default loop: :func:`~rayfed.train.sgd.local_sgd` with this half's extra loss.

        ``momentum_buffer`` (P floats, updated in place) carries SGD momentum into the round;
        ``None`` starts from zero, as a new optimiser does.
        """
        from rayfed.train.sgd import local_sgd  # torch: imported where clients train, not by the server

        job.scratch[_LOSS_CONSTANTS] = self.loss_constants(job)
        return local_sgd(job, extra_loss=self.extra_loss, momentum_buffer=momentum_buffer)

    def supports_stacking(self) -> bool:
        """True if this half trains with the default loop, so clients can be trained stacked."""
        cls = type(self)
        return all(getattr(cls, hook) is getattr(ClientHalf, hook) for hook in ("train", "extra_loss"))

    def has_extra_loss(self) -> bool:
        """True if :meth:`functional_extra_loss` may add a term (it is overridden; it may still return
        ``None``, as FedProx's does for μ = 0): stacked training evaluates it only then."""
        return type(self).functional_extra_loss is not ClientHalf.functional_extra_loss


class ServerHalf(abc.ABC, Generic[P, C]):
    """The server's state and aggregation rule. Lives in the ``ServerActor``.

    ``initial`` maps each architecture to its common initial parameter vector (all
    clients of an architecture start from it, as in the papers' code).
    """

    may_hold_nan: ClassVar[frozenset[str]] = frozenset()
    """Names of :meth:`state_dict` arrays in which NaN is a value ("not set yet", as FedAWA's weights of
    clients it has not seen). A resume refuses a checkpoint with NaN or infinite values anywhere else
    (:func:`rayfed.engine.checkpoint.verified_checkpoint`): the state of a run that diverged."""

    def __init__(self, params: P, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        type(self).validate(params, spec)
        self.params = params
        self.spec = spec

    @classmethod
    def validate(cls, params: P, spec: ProblemSpec) -> None:
        """The one check of ``params`` against the problem; raise ConfigError naming the field.

        The engine calls it before anything is written, and the constructor calls it again,
        so a server half built directly is checked the same way. Nothing to check by default.
        """

    @classmethod
    def held_out(cls, params: P, spec: ProblemSpec) -> HeldOutRequest | None:
        """The server data no client may own that this half needs (FedLAW's proxy set, KT-pFL's
        public set), or ``None`` (the default). The engine carves it out of the pool before the
        partition and hands it over as ``spec.held_out`` (:mod:`rayfed.data.held_out`)."""
        return None

    @classmethod
    def client_state_bytes(cls, params: P, spec: ProblemSpec, train: TrainConfig) -> int:
        """Bytes of state one client keeps between rounds (the client state store), for an algorithm
        registered with ``keeps_client_state``: what its clients really keep under ``params`` and the
        run's local training (``train``: a momentum buffer exists only with ``train.momentum`` > 0). By
        default one model, parameters and floating-point buffers in float32, of the run's largest
        architecture (:func:`model_state_bytes`: a client that keeps its own model). An algorithm whose
        clients keep less (cwFedAvg's BatchNorm buffers, FedPer's head, a momentum buffer) or more
        (APPLE's copies of every client's model) says so here: before anything is written, the engine
        refuses a run whose clients' states fit neither ``engine.client_state_memory_mb`` nor the free
        disk of the run directory (:func:`rayfed.engine.sizing.check_client_states`)."""
        return model_state_bytes(spec)

    @classmethod
    def server_state_bytes(cls, params: P, spec: ProblemSpec) -> int:
        """Bytes the server half holds while it aggregates, for the memory estimate made before a run starts
        (:func:`rayfed.engine.sizing.estimate_memory`); by default two models of the largest architecture,
        the global model and the sum it is aggregated from. A half that keeps more (per-client tables,
        K class models) says so here."""
        return 2 * model_state_bytes(spec)

    @classmethod
    def figures(cls, params: P, run: FinishedRun) -> list[Figure]:
        """The figures this method draws from a finished run (``rayfed plot``), as data; none by default."""
        return []

    @abc.abstractmethod
    def broadcast(self) -> Broadcast:
        """The message of the next round (a function of the server's state only)."""

    @abc.abstractmethod
    def aggregate(self, ctx: RoundContext, contribution: C | None) -> dict[str, float]:
        """Fold the round's summed contribution into the state; ``None`` means no client
        uploaded an acceptable update, and the state must stay as it is. Returns metrics."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume, as named numpy arrays (saved without pickle)."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None: ...

    def memory_bytes(self) -> int:
        """Bytes of state the server holds (for the scaling benchmark)."""
        return sum(int(v.nbytes) for v in self.state_dict().values())


def model_state_bytes(spec: ProblemSpec) -> int:
    """Bytes of one float32 model state (parameters, then floating-point buffers) of the largest architecture."""
    return 4 * max((sum(_sizes(spec, arch)) for arch in spec.layouts), default=0)


def parameter_bytes(spec: ProblemSpec) -> int:
    """Bytes of one float32 parameter vector (no buffers) of the largest architecture: a momentum buffer."""
    return 4 * max((_sizes(spec, arch)[0] for arch in spec.layouts), default=0)


def buffer_bytes(spec: ProblemSpec) -> int:
    """Bytes of one model's floating-point buffers (BatchNorm statistics) in float32, of the architecture that
    has the most."""
    return 4 * max((_sizes(spec, arch)[1] for arch in spec.layouts), default=0)


def momentum_bytes(spec: ProblemSpec, train: TrainConfig) -> int:
    """What a client that carries its SGD momentum buffer across rounds keeps: one parameter vector with
    ``train.momentum`` > 0, nothing without momentum."""
    return parameter_bytes(spec) if train.momentum else 0


def _sizes(spec: ProblemSpec, architecture: str) -> tuple[int, int]:
    """(parameters, floating-point buffers) of ``architecture``."""
    buffers = spec.buffer_layouts.get(architecture)
    return spec.layouts[architecture].size, 0 if buffers is None else buffers.size


