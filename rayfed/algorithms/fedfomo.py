"""FedFomo: each client weights the models of the others by the loss they save it per unit distance.

Zhang, Sapra, Fidler, Yeung and Alvarez, "Personalized Federated Learning with First Order
Model Optimization", ICLR 2021, arXiv:2012.08565. See docs/algorithms.md, FedFomo section.

The server keeps every client's latest uploaded model θ_n. At the start of its round, client
i downloads M of them (all, by default), evaluates each on its validation set (a fixed,
seeded ``val_ratio`` share of its training data) and weights it by the first-order estimate
of how far it moves its own model θ_i (its model from its last round) downhill (Eq. 6):

    w_n = max(0, (L_i(θ_i) − L_i(θ_n)) / ‖θ_n − θ_i‖),   w_n ← w_n / Σ_m w_m

then starts from (Eq. 5)

    θ_i ← θ_i + Σ_n w_n (θ_n − θ_i)

(its own model unchanged if no w_n is positive) and trains on the rest of its training data.
With M below the number of available models, the M are chosen ε-greedily from the client's
affinity vector P_i (P_in += w_n after every round it downloads n): with probability ε_t at
random, else the M of highest affinity (§3.2), ε_t = max(0, ε − t·decay) in round t as in the
authors' code (ε 0.3, decay 0.05: greedy from round 6 on).

Partial participation works: the server offers the latest model of every client that has
uploaded one (stale for those that sat out since).

``fidelity="pfllib"`` runs FedFomo as PFLlib does (``clientfomo.py``, ``serverfomo.py``), which the
cwFedAvg papers ran: the models are weighted against the model the client *started* its previous
round from (PFLlib's ``old_model``, copied right after the Eq. 5 update), not its trained model;
the client's own last upload is among the candidates; 10⁻⁵ is added to every distance; and the
validation set is the last ⌊``val_ratio`` · n⌋ samples of the client's training data in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from rayfed.algorithms.common.architecture import require_homogeneous, sole_architecture
from rayfed.algorithms.common.own_models import save_model_state, saved_model
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.declarations import VaryingWork
from rayfed.algorithms.hooks import ClientHalf, Contribution, RoundContext, ServerHalf, Start
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.algorithms.sizing import StateSizes
from rayfed.train.evaluate import model_losses
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.seeding import init_seed
from rayfed.util.validation import check_choice, check_int, check_real

if TYPE_CHECKING:
    from rayfed.train.settings import TrainConfig

__all__ = [
    "FedFomoParams",
    "fomo_weights",
    "validation_split",
    "tail_split",
    "decayed_epsilon",
    "choose_models",
    "FomoModels",
    "FedFomoClient",
    "FedFomoServer",
    "AFFINITY_KEY",
    "START_KEY",
]

AFFINITY_KEY = "affinity"
"""Key of the client's affinity vector P_i (one float64 per client) in its state."""
START_KEY = "start"
"""Key, with ``fidelity="pfllib"``, of the model the client started its last round from (PFLlib's ``old_model``)."""
PFLLIB_DISTANCE_OFFSET = 1e-5
"""What PFLlib adds to every distance of Eq. 6 (``clientfomo.py``, ``weight_cal``)."""

VAL_SPLIT_STREAM = 1 << 21
"""Stream of the validation split's seed: ``init_seed(seed, VAL_SPLIT_STREAM + client id)``."""
CHOICE_STREAM = 1 << 22
"""Stream of the ε-greedy choice: ``init_seed(seed, CHOICE_STREAM + round * num_clients + client id)``."""


@section("algorithm.params")
@dataclass(frozen=True)
class FedFomoParams:
    """Hyper-parameters of FedFomo (``algorithm.params.*``)."""

    num_models: int = documented(
        0, "M, the models each client downloads per round; 0 = every available one (the cwFedAvg papers' setting)."
    )
    val_ratio: float = documented(
        0.2, "Share of each client's training data held out to weight the models (PFLlib: 0.2)."
    )
    epsilon: float = documented(0.3, "ε of the ε-greedy choice of the M models (only read when M < available).")
    epsilon_decay: float = documented(
        0.05, "ε falls by this much every round, to 0 (the authors' code: 0.05 per round)."
    )
    fidelity: Literal["paper", "pfllib"] = documented(
        "paper",
        "paper: weight the models against the client's trained model θ_i^{t-1} (Eq. 6), others' models only, on a "
        "seeded validation split; pfllib: as PFLlib (the cwFedAvg papers' runs), against the model the client "
        "started its last round from, its own last upload among the candidates, distances + 1e-5, the last "
        "val_ratio of its training data as validation set.",
    )

    def __post_init__(self) -> None:
        p = "algorithm.params."
        check_int(p + "num_models", self.num_models, low=0)
        check_real(p + "val_ratio", self.val_ratio, low=0, high=1, low_open=True, high_open=True)
        check_real(p + "epsilon", self.epsilon, low=0, high=1)
        check_real(p + "epsilon_decay", self.epsilon_decay, low=0)
        check_choice(p + "fidelity", self.fidelity, ("paper", "pfllib"))


# --- the equations ------------------------------------------------------------------------------


def fomo_weights(
    own_loss: torch.Tensor, losses: torch.Tensor, distances: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw, normalised) weights of Eq. 6, in float64 on the tensors' device: raw w_n = (L(θ_i) − L(θ_n)) /
    ‖θ_n − θ_i‖ (0 where that distance is 0), normalised = max(0, w_n) / Σ max(0, w_m), all zero if none is
    positive."""
    losses, distances = losses.double(), distances.double()
    moved = distances > 0
    raw = torch.where(moved, (own_loss - losses) / torch.where(moved, distances, 1.0), torch.zeros_like(losses))
    positive = raw.clamp_min(0.0)
    total = positive.sum()
    return raw, torch.where(total > 0, positive / torch.where(total > 0, total, 1.0), positive)


def validation_split(num_train: int, val_ratio: float, seed: int, client_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(validation, training) indices into a client's training data: a fixed seeded permutation, the
    first round(val_ratio · n) (at least 1 when n ≥ 2) for validation, the rest for training."""
    order = np.random.default_rng(init_seed(seed, VAL_SPLIT_STREAM + client_id)).permutation(num_train)
    n_val = min(max(1, round(val_ratio * num_train)), num_train - 1) if num_train >= 2 else 0
    return np.sort(order[:n_val]), np.sort(order[n_val:])


def tail_split(num_train: int, val_ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """(validation, training) indices as PFLlib's ``load_train_data`` cuts them: the last ⌊val_ratio · n⌋
    samples in order validate, the others train (no validation set when that is 0)."""
    n_val = int(val_ratio * num_train)
    return np.arange(num_train - n_val, num_train), np.arange(num_train - n_val)


def decayed_epsilon(epsilon: float, decay: float, round_index: int) -> float:
    """ε_t = max(0, ε − t · decay): exploration fades as the affinities become informative."""
    return max(0.0, epsilon - decay * round_index)


def choose_models(
    candidates: np.ndarray, affinity: np.ndarray, m: int, epsilon: float, rng: np.random.Generator
) -> np.ndarray:
    """The ids of the models to download: all ``candidates`` if ``m`` is 0 or covers them; else with
    probability ε, m at random; else the m of highest affinity (ties to the lower id)."""
    if m == 0 or m >= len(candidates):
        return candidates
    if rng.random() < epsilon:
        return np.sort(rng.choice(candidates, size=m, replace=False))
    order = np.argsort(-affinity[candidates], kind="stable")
    return np.sort(candidates[order[:m]])


# --- worker side ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """A client's part in the round's weighing: its own model, its base, its candidates, its data's split."""

    own: np.ndarray
    base: np.ndarray
    chosen: np.ndarray
    val: np.ndarray
    train: np.ndarray


@dataclass(frozen=True)
class FomoModels:
    """Every client's latest model (one row each) and whether the server has one; a client downloads only the
    rows it chooses."""

    models: np.ndarray
    available: np.ndarray
    seed: int
    num_params: int


@dataclass
class FomoStart(Start):
    """A client's start (Eq. 5), with what its upload and its download count read: the ids of the models it
    downloaded and their raw weights w_n (Eq. 6, on the device)."""

    chosen: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    raw: Any = None


class FedFomoClient(VaryingWork, ClientHalf[FedFomoParams, FomoModels]):
    """Weights the downloaded models on its validation split (Eq. 6) on the device, starts from Eq. 5 and trains
    on the rest of its data; keeps θ_i and its affinities, and uploads θ_i whole."""

    def _plan(self, message: FomoModels, job: ClientJob, pfllib: bool) -> _Plan:
        """The client's own model, the base it weighs against, its chosen candidates and its data's split."""
        own = np.asarray(saved_model(job, message.models[job.client_id]), dtype=np.float32)
        base = np.asarray(job.state[START_KEY], np.float32) if pfllib and job.state and START_KEY in job.state else own
        params = self.params
        val, train = (
            tail_split(job.num_train, params.val_ratio)
            if pfllib
            else validation_split(job.num_train, params.val_ratio, message.seed, job.client_id)
        )
        others = np.arange(len(message.available)) != job.client_id
        candidates = np.flatnonzero(message.available if pfllib else message.available & others)
        stream = CHOICE_STREAM + job.round * len(message.available) + job.client_id
        rng = np.random.default_rng(init_seed(message.seed, stream))
        epsilon = decayed_epsilon(params.epsilon, params.epsilon_decay, job.round)
        chosen = choose_models(candidates, _affinity(job, len(message.available)), params.num_models, epsilon, rng)
        return _Plan(own, base, chosen, np.asarray(val, np.int64), np.asarray(train, np.int64))

    def start(self, message: FomoModels, job: ClientJob) -> FomoStart:
        """Weight the downloaded models on the validation split (Eq. 6), start from Eq. 5, and leave only the
        training part of the data in the job."""
        pfllib = self.params.fidelity == "pfllib"
        plan = self._plan(message, job, pfllib)
        device = job.device
        own, base = to_device([plan.own, plan.base], device)
        start, raw = own, torch.zeros(len(plan.chosen), dtype=torch.float64, device=device)
        if len(plan.chosen) and len(plan.val):
            p = message.num_params
            rows = to_device([message.models[plan.chosen]], device)[0]
            val = to_device([plan.val], device)[0]
            losses = model_losses(
                job.flat, job.architecture, torch.cat([rows, base[None]]), job.x_train[val], job.y_train[val]
            )
            distances = np.linalg.norm(message.models[plan.chosen, :p].astype(np.float64) - plan.base[:p], axis=1)
            offset = PFLLIB_DISTANCE_OFFSET if pfllib else 0.0
            raw, weights = fomo_weights(losses[-1], losses[:-1], to_device([distances + offset], device)[0])
            delta = weights @ (rows.double() - base.double())
            start = torch.where(weights.sum() > 0, (base.double() + delta).float(), own)
        _keep_train(job, plan)
        return FomoStart(start, plan.chosen, raw)

    def work_start(self, message: FomoModels, job: ClientJob) -> FomoStart:
        """The start of the same download and phases, without weighing the models: the ones it chooses, its
        own model, and its data cut to the training part."""
        plan = self._plan(message, job, self.params.fidelity == "pfllib")
        _keep_train(job, plan)
        return FomoStart(plan.own, plan.chosen)

    def upload(self, message: FomoModels, job: ClientJob) -> Contribution:
        """Keep θ_i and the affinities (P_in += w_n), and with ``pfllib`` the start as the next base; upload θ_i."""
        start: FomoStart = job.start
        affinity = to_device([_affinity(job, len(message.available))], job.device)[0].clone()
        affinity[to_device([start.chosen], job.device)[0]] += start.raw
        save_model_state(job)
        assert job.state is not None
        job.state[AFFINITY_KEY] = affinity
        if self.params.fidelity == "pfllib":
            job.state[START_KEY] = start.model
        return ClientVectors.of(job.trained.clone(), job.client_id, job.num_train)

    def evaluation(self, message: FomoModels, job: ClientJob) -> np.ndarray:
        """The client's own model, the one it trained last (the initial model if it never trained)."""
        return saved_model(job, message.models[job.client_id])

    def bytes_down(self, message: FomoModels, job: ClientJob) -> int:
        """The models it downloaded (its own last upload among them only with ``fidelity="pfllib"``)."""
        return len(job.start.chosen) * int(message.models.shape[1]) * 4


def _keep_train(job: ClientJob, plan: _Plan) -> None:
    """Leave only the training part of the client's data in its job (the validation part weighs the models)."""
    keep = to_device([plan.train], job.device)[0]
    job.x_train, job.y_train = job.x_train[keep], job.y_train[keep]


def _affinity(job: ClientJob, num_clients: int) -> np.ndarray:
    if job.state is not None and AFFINITY_KEY in job.state:
        return np.asarray(job.state[AFFINITY_KEY], dtype=np.float64)
    return np.zeros(num_clients, dtype=np.float64)


# --- server side ----------------------------------------------------------------------------


class FedFomoServer(StateSizes, ServerHalf[FedFomoParams, ClientVectors]):
    """Keeps every client's latest uploaded model; a row is offered once its client has uploaded."""

    @classmethod
    def validate(cls, params: FedFomoParams, spec: ProblemSpec) -> None:
        require_homogeneous(spec)

    def __init__(self, params: FedFomoParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        architecture = sole_architecture(spec)
        self.num_params = spec.layouts[architecture].size
        self.models = np.tile(np.asarray(initial[architecture], dtype=np.float32), (spec.num_clients, 1))
        self.available = np.zeros(spec.num_clients, dtype=bool)

    @classmethod
    def client_state_bytes(cls, params: FedFomoParams, spec: ProblemSpec, train: TrainConfig) -> int:
        """The client's model and its affinity vector (one float64 per client); with ``fidelity="pfllib"``
        also the model it started its last round from."""
        models = 2 if params.fidelity == "pfllib" else 1
        return models * super().client_state_bytes(params, spec, train) + 8 * spec.num_clients

    def broadcast(self) -> FomoModels:
        return FomoModels(self.models, self.available, self.spec.seed, self.num_params)

    def aggregate(self, ctx: RoundContext, contribution: ClientVectors) -> dict[str, float]:
        self.models = self.models.copy()  # the last broadcast still reads the old rows
        self.models[contribution.client_ids] = contribution.matrix()
        self.available = self.available.copy()
        self.available[contribution.client_ids] = True
        return {"clients_aggregated": float(contribution.count)}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"models": self.models, "available": self.available.astype(np.uint8)}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.models = np.array(state["models"], dtype=np.float32)
        self.available = np.asarray(state["available"]).astype(bool)


register_algorithm(
    "fedfomo",
    params=FedFomoParams,
    server=FedFomoServer,
    client=FedFomoClient,
    summary="FedFomo (Zhang et al. 2021): clients weight others' models by validation-loss gain per distance",
    keeps_client_state=True,
    reporting=Reporting(label="FedFomo"),
)
