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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from rayfed.algorithms.common.architecture import require_homogeneous, sole_architecture
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.hooks import Broadcast, ClientHalf, Contribution, RoundContext, ServerHalf
from rayfed.algorithms.registry import register_algorithm
from rayfed.train.host import to_device, to_host
from rayfed.train.job import ClientJob
from rayfed.train.layout import ParamLayout
from rayfed.train.loop import FINAL_CARRY
from rayfed.train.phase import Carry, Constants, Edits, NoStep, Params, Phase
from rayfed.train.problem import ProblemSpec
from rayfed.train.scratch import ScratchKey
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
CORES_KEY, DR_KEY, VERSIONS_KEY = "cores", "p", "versions"
"""Client state: the copies of every core model (M, S), the DR vector p_i (M,), each copy's version (M,)."""

_CORES = ScratchKey[tuple[np.ndarray, np.ndarray, np.ndarray]]("apple.cores")
"""``job.scratch`` key: (the refreshed copies, p_i, the copies' versions), personalise -> train -> contribute."""
_TARGET = ScratchKey[np.ndarray]("apple.p0")
"""``job.scratch`` key: p⁽⁰⁾, the proximal term's target, from the broadcast."""
_DOWNLOADED = ScratchKey[int]("apple.downloaded")


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
class CoreModels(Broadcast):
    """Every client's latest core model and its version (the round after which it was uploaded;
    0 = the common initial model); a client downloads the rows newer than its copies."""

    cores: np.ndarray
    versions: np.ndarray
    num_params: int
    initial: np.ndarray
    """The common initial model every copy starts as."""
    p0: np.ndarray
    """p⁽⁰⁾ (M,): the size shares, the proximal term's target."""
    start: np.ndarray
    """p_i before a client's first round (M,): 1/M (``fidelity="pfllib_parallel"``) or p⁽⁰⁾ (``"paper"``)."""
    rebased: bool
    """``fidelity="pfllib_parallel"``: a client's core is its last personal model, and it is evaluated with it."""

    def local_state(self, job: ClientJob) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(copies, p_i, their versions) the client holds; before its first round, the initial model
        for every client, p_i = :attr:`start` and versions 0."""
        m = len(self.versions)
        if job.state is not None and CORES_KEY in job.state:
            return job.state[CORES_KEY], job.state[DR_KEY], job.state[VERSIONS_KEY]
        return np.tile(self.initial, (m, 1)), self.start, np.zeros(m, np.int64)

    def personalise(self, job: ClientJob) -> None:
        """Refresh the copies that changed (a download each), then load φ_i = Σ_j p_ij θ_j."""
        copies, p, versions = self.local_state(job)
        stale = self.versions > versions
        stale[job.client_id] = False  # its own core model is local
        cores = np.array(copies, dtype=np.float32)
        cores[stale] = self.cores[stale]
        job.scratch[_CORES] = (cores, np.array(p, dtype=np.float64), np.where(stale, self.versions, versions))
        job.scratch[_TARGET] = self.p0
        job.scratch[_DOWNLOADED] = int(stale.sum())
        job.flat.load_state(personal_model(cores, p, job.client_id, self.num_params))

    def contribute(self, job: ClientJob) -> ClientVectors:
        """Keep the copies (its own core updated) and p_i; upload the core model θ_i."""
        cores, p, versions = job.scratch[_CORES]
        job.state = {**(job.state or {}), CORES_KEY: cores, DR_KEY: p, VERSIONS_KEY: versions}
        return ClientVectors.of(cores[job.client_id].copy(), job.client_id, job.num_train)

    def prepare_eval(self, job: ClientJob) -> None:
        """The personal model φ_i from the client's copies and p_i; re-based (``pfllib_parallel``), the personal
        model of its last step, which its own core has become (the initial model before it trained)."""
        copies, p, _ = self.local_state(job)
        if self.rebased:
            job.flat.load_state(np.array(copies[job.client_id], dtype=np.float32))
        else:
            job.flat.load_state(personal_model(copies, p, job.client_id, self.num_params))

    def bytes_down(self, job: ClientJob) -> int:
        count = job.scratch.get(_DOWNLOADED)
        if count is None:
            _, _, versions = self.local_state(job)
            newer = self.versions > versions
            count = int(newer.sum()) - int(newer[job.client_id])
        return int(count) * int(self.cores.shape[1]) * 4


def personal_model(cores: np.ndarray, p: np.ndarray, own: int, num_params: int) -> np.ndarray:
    """φ_i: Σ_j p_ij θ_j over the parameters; the floating-point buffers (BatchNorm statistics) are the
    client's own core model's, since they describe its own data."""
    out = np.array(cores[own], dtype=np.float32)
    out[:num_params] = (np.asarray(p, np.float64) @ cores[:, :num_params].astype(np.float64)).astype(np.float32)
    return out


class AppleClient(ClientHalf[AppleParams]):
    """Plain SGD steps on θ_i and p_i through φ_i = Σ_j p_ij θ_j (``train.momentum`` and ``train.weight_decay``
    are not used).

    The model the loop trains is φ_i, formed before every step (:meth:`mix`); after backward, the step moves
    θ_i and p_i (:meth:`descend`), not φ_i (``NoStep``). The other clients' copies θ_j are constants of the
    phase; θ_i and p_i are its carry.
    """

    def __init__(self, params: AppleParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        self.layout = spec.layouts[sole_architecture(spec)]
        self.pfllib = params.fidelity == "pfllib_parallel"
        self.weights = tensor_mean_weights(self.layout) if self.pfllib else None

    def phases(self, job: ClientJob) -> list[Phase]:
        params, own, size = self.params, job.client_id, self.layout.size
        cores, p, _ = job.scratch[_CORES]
        m = cores.shape[0]
        horizon = params.anneal_rounds or job.train.rounds
        schedule = lagged_anneal if self.pfllib else anneal
        lam_mu = schedule(job.round, horizon, params.anneal_fraction) * params.mu
        onehot = np.zeros(m, np.float32)
        onehot[own] = 1.0
        numbers = np.array([lam_mu, job.lr * (m if self.pfllib else 1)], dtype=np.float64)
        arrays = [cores[:, :size], onehot, job.scratch[_TARGET], numbers, cores[own, :size], p]
        if self.weights is not None:
            arrays.append(self.weights)
        moved = to_device([np.ascontiguousarray(a) for a in arrays], job.device)
        constants = {"cores": moved[0], "own": moved[1], "p0": moved[2], "numbers": moved[3]}
        if self.pfllib:
            constants["weights"] = moved[6]
        return [
            Phase(
                epochs=job.train.local_epochs,
                optimizer=NoStep(),
                constants=constants,
                carry={"core": moved[4], "p": moved[5]},
                on_train_batch_start=self.mix,
                on_after_backward=self.descend,
                on_train_end=self.finish,
            )
        ]

    def _theta(self, constants: Constants, core: torch.Tensor) -> torch.Tensor:
        """Every client's core model, this client's as it trains (M, P)."""
        return torch.where(constants["own"].unsqueeze(1) > 0, core, constants["cores"])

    def _personal(self, constants: Constants, carry: Carry) -> Edits:
        """φ_i = Σ_j p_ij θ_j, as the parameters' new values."""
        phi = carry["p"].to(torch.float32) @ self._theta(constants, carry["core"])
        return dict(enumerate(self.layout.views(phi)))

    def mix(self, params: Params, constants: Constants, carry: Carry) -> tuple[Edits, Carry]:
        """Before each step: the model is φ_i."""
        return self._personal(constants, carry), carry

    def descend(self, params: Params, grads: Params, constants: Constants, carry: Carry) -> tuple[Edits, Carry]:
        """θ_i ← θ_i − η1·p_ii·∇_φ L and p_i ← p_i − η2·∂/∂p_i (``pfllib_parallel``: θ_i first, p's gradient at the
        moved θ_i; ``paper``: both gradients at the same point)."""
        grad = self.layout.flatten(grads)
        core, p = carry["core"], carry["p"]
        lam_mu, core_lr = constants["numbers"][0], constants["numbers"][1]
        step = (core_lr * (p * constants["own"]).sum()).to(torch.float32)
        moved = core.addcmul(grad, step, value=-1.0)
        at = moved if self.pfllib else core
        grad_p = dr_gradient(self._theta(constants, at), grad, p, constants["p0"], lam_mu, constants.get("weights"))
        return {}, {"core": moved, "p": p - self.params.dr_lr * grad_p}

    def finish(self, params: Params, constants: Constants, carry: Carry) -> tuple[Edits, Carry]:
        """``pfllib_parallel``: the core it shares is its personal model of the last step (re-based); ``paper``:
        the model left is the personal model after the last step (what the engine's update norm measures)."""
        if self.pfllib:
            return {}, {**carry, "core": self.layout.flatten(params)}
        return self._personal(constants, carry), carry

    def contribute_stacked(self, message: Broadcast, jobs: Sequence[ClientJob], states: Any) -> None:
        """One by one (:meth:`contribute`)."""
        return None

    def contribute(self, message: Broadcast, job: ClientJob) -> Contribution:
        """The message's upload, from the copies with this client's trained core (and the BatchNorm statistics its
        steps updated) and its new p_i."""
        cores, p, versions = job.scratch[_CORES]
        carry = job.scratch.get(FINAL_CARRY, {}).get(0)
        if carry is not None:
            core, p, buffers = to_host([carry["core"], carry["p"], job.flat.buffers])
            cores = np.array(cores, dtype=np.float32)
            cores[job.client_id] = np.concatenate([core, buffers])
            job.scratch[_CORES] = (cores, p, versions)
        return message.contribute(job)


# --- server side ----------------------------------------------------------------------------


class AppleServer(ServerHalf[AppleParams, ClientVectors]):
    """Keeps every client's latest core model and its version; aggregates nothing."""

    @classmethod
    def validate(cls, params: AppleParams, spec: ProblemSpec) -> None:
        require_homogeneous(spec)

    @classmethod
    def client_state_bytes(cls, params: AppleParams, spec: ProblemSpec, train: TrainConfig) -> int:
        """M copies of the model, p_i (float64) and the copies' versions (int64): grows as M per client."""
        return spec.num_clients * (super().client_state_bytes(params, spec, train) + 16)

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
        return CoreModels(self.cores, self.versions, self.num_params, self.initial, self.p0, self.start, self.rebased)

    def aggregate(self, ctx: RoundContext, contribution: ClientVectors | None) -> dict[str, float]:
        if contribution is None:
            return {"clients_aggregated": 0.0}
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
    label="APPLE",
)
