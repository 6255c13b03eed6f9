"""APPLE: each client learns how much of every client's core model its personal model takes.

Luo and Wu, "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated
Learning", IJCAI 2022, arXiv:2110.08394. See docs/algorithms.md, APPLE section.

Every client i trains a *core model* θ_i, the one it shares, and keeps local copies of all
clients' core models, refreshed from the server whenever a newer one is there. Its personal
model is their mixture under its *directed-relationship* (DR) vector p_i:

    φ_i = Σ_j p_ij θ_j

Each mini-batch step descends the client's loss

    L_i(φ_i) + (λ(r) μ / 2) ‖p_i − p⁽⁰⁾‖²,   λ(r) = (1 + cos(π r / (L·R))) / 2 for r < L·R, else 0

in its own core model (∂/∂θ_i = p_ii ∇_φ L_i, learning rate η1 = ``train.lr``) and in p_i
(∂/∂p_ij = ⟨∇_φ L_i, θ_j⟩, learning rate η2): the proximal term keeps p_i near
p⁽⁰⁾_j = n_j / Σ n (the clients' shares of the training data, as in PFLlib and the authors'
code) early on and fades out by round L·R (R = ``train.rounds``). Only core models travel: the
client uploads θ_i, and downloads the core models that changed since its last copy.

``fidelity="pfllib_parallel"`` (the default) is PFLlib's APPLE (``clientapple.py``, which the cwFedAvg
papers ran) but for one thing: its p-gradient is the mean over parameter tensors of mean(∇_φ L ⊙ θ_j), its
core learning rate η1 · M and p_i starts at 1/M; each step updates θ_i first and takes p's gradient at the
updated θ_i; λ lags a round (round r uses λ(r − 1), round 0 λ = 1, L·R truncated to an integer); and the
core a client shares after its round is its personal model φ_i of its last step ("re-based": PFLlib's
``model_c = deepcopy(model)``), which is also the model it is evaluated with. The one thing: PFLlib trains
the clients of a round one after another on shared core objects, so a client sees the core updates of the
clients before it in the same round; here the clients of a round train in parallel from the cores of the
round's start. ``fidelity="paper"`` is the paper's algorithm (module docstring above).

A client's state holds M models (M = clients), so all states together grow as M²; the
engine refuses a run whose states would fit neither ``engine.client_state_memory_mb`` nor
the run directory's free disk (``FedAppleServer.client_state_bytes``, :mod:`rayfed.engine.sizing`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from rayfed.algorithms.common.architecture import require_homogeneous, sole_architecture
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.declarations import VaryingWork
from rayfed.algorithms.hooks import ClientHalf, Contribution, RoundContext, ServerHalf, Start
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.algorithms.sizing import StateSizes
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.layout import ParamLayout
from rayfed.train.phase import NO_PARAMETERS, SGD, Constants, Edits, Extra, Grads, Params, Phase, Trainable
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_choice, check_int, check_real

if TYPE_CHECKING:
    from rayfed.train.settings import TrainConfig

__all__ = [
    "AppleParams",
    "size_shares",
    "anneal",
    "lagged_anneal",
    "tensor_mean_weights",
    "dr_gradient",
    "CoreModels",
    "AppleClient",
    "AppleServer",
]

FIDELITIES = ("pfllib_parallel", "paper")
CORES_KEY, OWN_KEY, DR_KEY, VERSIONS_KEY = "cores", "own", "p", "versions"
"""Client state: the copies of every core model (M, S), its own core as it last trained it (S,), the DR vector p_i
(M,), each copy's version (M,)."""


@section("algorithm.params")
@dataclass(frozen=True)
class AppleParams:
    """Hyper-parameters of APPLE (``algorithm.params.*``); defaults of the cwFedAvg papers' baseline."""

    dr_lr: float = documented(0.01, "η2, the learning rate of the DR vector p_i.")
    mu: float = documented(0.1, "μ, the weight of the proximal term (μ/2)‖p_i − p⁽⁰⁾‖².")
    anneal_fraction: float = documented(
        0.2, "L: λ(r) is cosine-annealed from 1 to 0 over the first L·R rounds (R = train.rounds), then 0."
    )
    anneal_rounds: int = documented(
        0,
        "R of L·R when > 0, instead of train.rounds: the paper's schedule in a shorter run (e.g. 1000 for the "
        "papers' 1000 rounds), and a run extended to more rounds keeps the schedule it started with.",
    )
    fidelity: Literal["pfllib_parallel", "paper"] = documented(
        "pfllib_parallel",
        "pfllib_parallel: PFLlib's APPLE (the cwFedAvg papers' runs) with the clients of a round in parallel: "
        "∂/∂p_ij = the mean over parameter tensors of mean(∇_φ L ⊙ θ_j) at the updated θ_i, core lr = "
        "train.lr · M, p_i starts at 1/M, λ one round late, the shared core re-based on the personal model; "
        "paper: ∂/∂p_ij = ⟨∇_φ L, θ_j⟩ before θ_i moves, core lr = train.lr, p_i starts at p⁽⁰⁾, the core θ_i "
        "shared (the authors' code). Both: p⁽⁰⁾_j = n_j / Σ n.",
    )

    def __post_init__(self) -> None:
        p = "algorithm.params."
        check_real(p + "dr_lr", self.dr_lr, low=0)
        check_real(p + "mu", self.mu, low=0)
        check_real(p + "anneal_fraction", self.anneal_fraction, low=0, high=1)
        check_int(p + "anneal_rounds", self.anneal_rounds, low=0)
        check_choice(p + "fidelity", self.fidelity, FIDELITIES)


# --- the equations ------------------------------------------------------------------------------


def size_shares(train_sizes: np.ndarray) -> np.ndarray:
    """p⁽⁰⁾_j = n_j / Σ_k n_k, the proximal term's target for every client (PFLlib and the authors' code)."""
    sizes = np.asarray(train_sizes, dtype=np.float64)
    return sizes / sizes.sum()


def anneal(round_index: int, rounds: int, fraction: float) -> float:
    """λ(r) = (1 + cos(π r / (L·R))) / 2 for r < L·R, else 0."""
    horizon = fraction * rounds
    if round_index >= horizon:
        return 0.0
    return 0.5 * (1.0 + math.cos(math.pi * round_index / horizon))


def lagged_anneal(round_index: int, rounds: int, fraction: float) -> float:
    """PFLlib's λ: 1 in round 0, then the round before's λ(r − 1) over int(L·R) rounds (``clientapple.py``
    sets it after each round's training)."""
    if round_index == 0:
        return 1.0
    return anneal(round_index - 1, int(fraction * rounds), 1.0)


def tensor_mean_weights(layout: ParamLayout) -> np.ndarray:
    """c (P,) with ⟨g ⊙ θ, c⟩ = mean over the T parameter tensors of the tensor's mean of g ⊙ θ
    (``fidelity="pfllib"``): c = 1 / (T · numel of the entry's tensor)."""
    sizes = np.diff(np.asarray(layout.offsets))
    return np.repeat(1.0 / (len(sizes) * sizes), sizes).astype(np.float32)


def dr_gradient(
    cores: torch.Tensor,
    grad: torch.Tensor,
    p: torch.Tensor,
    p0: torch.Tensor,
    lam_mu: float | torch.Tensor,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """∂/∂p of L_i(Σ_j p_j θ_j) + (λμ/2)‖p − p0‖²: ⟨∇_φ L, θ_j⟩ + λμ (p_j − p0_j) for each row θ_j of
    ``cores`` (M, P), ``grad`` = ∇_φ L (P,); with ``weights`` c, ⟨∇_φ L ⊙ c, θ_j⟩ instead (PFLlib's scaling)."""
    g = grad if weights is None else grad * weights
    return (cores @ g).to(p.dtype) + lam_mu * (p - p0)


# --- worker side ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CoreModels:
    """Every client's latest core model and its version (the round after which it was uploaded; 0 = the common
    initial model); a client downloads the rows newer than its copies."""

    cores: np.ndarray
    versions: np.ndarray
    num_params: int
    initial: np.ndarray
    """The common initial model every copy starts as."""
    p0: np.ndarray
    """p⁽⁰⁾ (M,): the size shares, the proximal term's target."""
    start: np.ndarray
    """p_i before a client's first round (M,): 1/M (``fidelity="pfllib_parallel"``) or p⁽⁰⁾ (``"paper"``)."""


@dataclass
class AppleStart(Start):
    """A client's start φ_i, with the copies it refreshed, p_i, the copies' versions and how many it downloaded."""

    cores: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    p: np.ndarray = field(default_factory=lambda: np.zeros(0))
    versions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    downloaded: int = 0


def local_state(message: CoreModels, job: ClientJob) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(copies, p_i, their versions) the client holds, its own core as it last trained it; before its first round,
    the initial model for every client, p_i = ``message.start`` and versions 0."""
    m = len(message.versions)
    state = job.state
    if state is None or CORES_KEY not in state:
        return np.tile(message.initial, (m, 1)), message.start, np.zeros(m, np.int64)
    copies = np.array(state[CORES_KEY], dtype=np.float32)
    if OWN_KEY in state:
        copies[job.client_id] = state[OWN_KEY]
    return copies, np.asarray(state[DR_KEY]), np.asarray(state[VERSIONS_KEY])


def personal_model(cores: np.ndarray, p: np.ndarray, own: int, num_params: int) -> np.ndarray:
    """φ_i: Σ_j p_ij θ_j over the parameters; the floating-point buffers (BatchNorm statistics) are the
    client's own core model's, since they describe its own data."""
    out = np.array(cores[own], dtype=np.float32)
    out[:num_params] = (np.asarray(p, np.float64) @ cores[:, :num_params].astype(np.float64)).astype(np.float32)
    return out


class AppleClient(VaryingWork, ClientHalf[AppleParams, CoreModels]):
    """Plain SGD steps on θ_i and p_i through φ_i = Σ_j p_ij θ_j (``train.momentum`` and ``train.weight_decay``
    are not used).

    The model the loop trains is φ_i, formed before every step (:meth:`mix`); no parameter of it steps
    (``NO_PARAMETERS``): θ_i and p_i are the phase's trainables, which its SGD moves by the gradients
    :meth:`descend` reads off ∇_φ L after backward. The other clients' copies θ_j are constants of the phase.
    """

    def __init__(self, params: AppleParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        self.layout = spec.layouts[sole_architecture(spec)]
        self.pfllib = params.fidelity == "pfllib_parallel"
        self.weights = tensor_mean_weights(self.layout) if self.pfllib else None

    def start(self, message: CoreModels, job: ClientJob) -> AppleStart:
        """Refresh the copies that changed (a download each), then φ_i = Σ_j p_ij θ_j."""
        refreshed = self._refreshed(message, job)
        refreshed.model = personal_model(refreshed.cores, refreshed.p, job.client_id, message.num_params)
        return refreshed

    def work_start(self, message: CoreModels, job: ClientJob) -> AppleStart:
        """The start of the same download and phases without mixing φ_i: its own core stands in for it."""
        refreshed = self._refreshed(message, job)
        refreshed.model = refreshed.cores[job.client_id]
        return refreshed

    def _refreshed(self, message: CoreModels, job: ClientJob) -> AppleStart:
        """The client's copies with those that changed refreshed (a download each), p_i and the copies' versions;
        no model yet."""
        copies, p, versions = local_state(message, job)
        stale = message.versions > versions
        stale[job.client_id] = False  # its own core model is local
        copies[stale] = message.cores[stale]
        fresh = np.where(stale, message.versions, versions)
        return AppleStart(None, copies, np.array(p, dtype=np.float64), fresh, int(stale.sum()))

    def phases(self, message: CoreModels, job: ClientJob) -> list[Phase]:
        params, own, size = self.params, job.client_id, self.layout.size
        start: AppleStart = job.start
        m = start.cores.shape[0]
        horizon = params.anneal_rounds or job.train.rounds
        schedule = lagged_anneal if self.pfllib else anneal
        lam_mu = schedule(job.round, horizon, params.anneal_fraction) * params.mu
        onehot = np.zeros(m, np.float32)
        onehot[own] = 1.0
        core_lr = job.lr * (m if self.pfllib else 1)
        numbers = np.array([lam_mu, core_lr], dtype=np.float64)
        arrays = [start.cores[:, :size], onehot, message.p0, numbers, start.cores[own, :size], start.p]
        if self.weights is not None:
            arrays.append(self.weights)
        moved = to_device([np.ascontiguousarray(a) for a in arrays], job.device)
        constants = {"cores": moved[0], "own": moved[1], "p0": moved[2], "numbers": moved[3]}
        if self.weights is not None:
            constants["weights"] = moved[6]
        return [
            Phase(
                epochs=job.train.local_epochs,
                optimizer=SGD(momentum=0.0, weight_decay=0.0),
                trains=NO_PARAMETERS,
                constants=constants,
                extra={"core": Trainable(moved[4], lr=core_lr), "p": Trainable(moved[5], lr=params.dr_lr)},
                on_train_batch_start=self.mix,
                on_after_backward=self.descend,
                on_train_end=self.finish,
            )
        ]

    def _theta(self, constants: Constants, core: torch.Tensor) -> torch.Tensor:
        """Every client's core model, this client's as it trains (M, P)."""
        return torch.where(constants["own"].unsqueeze(1) > 0, core, constants["cores"])

    def _personal(self, constants: Constants, extra: Extra) -> Edits:
        """φ_i = Σ_j p_ij θ_j, as the parameters' new values."""
        phi = extra["p"].to(torch.float32) @ self._theta(constants, extra["core"])
        return dict(enumerate(self.layout.views(phi)))

    def mix(self, params: Params, constants: Constants, extra: Extra) -> Edits:
        """Before each step: the model is φ_i."""
        return self._personal(constants, extra)

    def descend(self, params: Params, grads: Grads, constants: Constants, extra: Extra) -> Edits:
        """The gradients of θ_i (p_ii·∇_φ L) and of p_i (Eq. for ∂/∂p, :func:`dr_gradient`): ``pfllib_parallel`` at
        the θ_i its step moves to, ``paper`` at the same point."""
        grad = self.layout.flatten([g for g in grads if g is not None])
        core, p = extra["core"], extra["p"]
        lam_mu, core_lr = constants["numbers"][0], constants["numbers"][1]
        core_grad = ((p * constants["own"]).sum() * grad).to(torch.float32)
        at = core - (core_lr * core_grad).to(torch.float32) if self.pfllib else core
        grad_p = dr_gradient(self._theta(constants, at), grad, p, constants["p0"], lam_mu, constants.get("weights"))
        return {"core": core_grad, "p": grad_p}

    def finish(self, params: Params, constants: Constants, extra: Extra) -> Edits:
        """``pfllib_parallel``: the core it shares is its personal model of the last step (re-based); ``paper``:
        the model left is the personal model after the last step (what the engine's update norm measures)."""
        if self.pfllib:
            return {"core": self.layout.flatten(params)}
        return self._personal(constants, extra)

    def upload(self, message: CoreModels, job: ClientJob) -> Contribution:
        """Keep the copies, its trained core (with the BatchNorm statistics its steps updated) and its new p_i;
        upload that core θ_i."""
        start: AppleStart = job.start
        own = torch.cat([job.extra["core"], job.trained[self.layout.size :]])
        job.state = {CORES_KEY: start.cores, OWN_KEY: own, DR_KEY: job.extra["p"], VERSIONS_KEY: start.versions}
        return ClientVectors.of(own, job.client_id, job.num_train)

    def evaluation(self, message: CoreModels, job: ClientJob) -> np.ndarray:
        """The personal model φ_i from the client's copies and p_i; re-based (``pfllib_parallel``), the personal
        model of its last step, which its own core has become (the initial model before it trained)."""
        copies, p, _ = local_state(message, job)
        if self.pfllib:
            return np.array(copies[job.client_id], dtype=np.float32)
        return personal_model(copies, p, job.client_id, message.num_params)

    def bytes_down(self, message: CoreModels, job: ClientJob) -> int:
        return job.start.downloaded * int(message.cores.shape[1]) * 4


# --- server side ----------------------------------------------------------------------------


class AppleServer(StateSizes, ServerHalf[AppleParams, ClientVectors]):
    """Keeps every client's latest core model and its version; aggregates nothing."""

    @classmethod
    def validate(cls, params: AppleParams, spec: ProblemSpec) -> None:
        require_homogeneous(spec)

    @classmethod
    def client_state_bytes(cls, params: AppleParams, spec: ProblemSpec, train: TrainConfig) -> int:
        """M copies of the model, p_i (float64) and the copies' versions (int64): grows as M per client; and its own
        trained core beside its copy."""
        model = super().client_state_bytes(params, spec, train)
        return spec.num_clients * (model + 16) + model

    def __init__(self, params: AppleParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        architecture = sole_architecture(spec)
        self.num_params = spec.layouts[architecture].size
        self.initial = np.asarray(initial[architecture], dtype=np.float32)
        self.cores = np.tile(self.initial, (spec.num_clients, 1))
        self.versions = np.zeros(spec.num_clients, dtype=np.int64)
        if spec.train_sizes is None:
            raise ValueError(
                "APPLE's server needs every client's training-set size (ProblemSpec.train_sizes, "
                "which the engine sets from the partition)"
            )
        self.p0 = size_shares(spec.train_sizes)
        self.rebased = params.fidelity == "pfllib_parallel"
        self.start = np.full(spec.num_clients, 1.0 / spec.num_clients) if self.rebased else self.p0

    def broadcast(self) -> CoreModels:
        return CoreModels(self.cores, self.versions, self.num_params, self.initial, self.p0, self.start)

    def aggregate(self, ctx: RoundContext, contribution: ClientVectors) -> dict[str, float]:
        self.cores, self.versions = self.cores.copy(), self.versions.copy()  # the last broadcast reads the old
        self.cores[contribution.client_ids] = contribution.matrix()
        self.versions[contribution.client_ids] = ctx.round + 1
        return {"clients_aggregated": float(contribution.count)}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"cores": self.cores, "versions": self.versions}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.cores = np.array(state["cores"], dtype=np.float32)
        self.versions = np.array(state["versions"], dtype=np.int64)


register_algorithm(
    "apple",
    params=AppleParams,
    server=AppleServer,
    client=AppleClient,
    summary="APPLE (Luo & Wu 2022): personal model = DR-vector mix of all clients' core models, copies kept locally",
    keeps_client_state=True,
    reporting=Reporting(label="APPLE"),
)
