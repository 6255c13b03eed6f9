"""FedAMP: federated attentive message passing, a personal cloud model per client.

Huang, Chu, Zhou, Wang, Liu, Pei and Zhang, "Personalized Cross-Silo Federated Learning on
Non-IID Data", AAAI 2021, arXiv:2007.03797. See docs/algorithms.md, FedAMP section.

The server keeps every client's latest model w_i. Before a round it forms, for each
client i, its personal cloud model (the message passing step, Eq. 7 of the paper):

    u_i = Σ_j ξ_ij w_j,   ξ_ij = α_K · A'(‖w_i − w_j‖²)  (j ≠ i),   ξ_ii = 1 − Σ_{j≠i} ξ_ij

with the attention-inducing function A(x) = 1 − exp(−x/σ), so A'(x) = exp(−x/σ)/σ. Client i
then takes the proximal step (Eq. 8)

    w_i = argmin_w  F_i(w) + (λ / (2 α_K)) ‖w − u_i‖²

by SGD on cross-entropy plus the proximal term (with its gradient), started from its own
last w_i (``start="own"``, as PFLlib) or from u_i (``start="cloud"``), and uploads w_i. The
client keeps w_i and is evaluated with it.

With small distances (‖w_i − w_j‖² ≲ σ) the weights α_K·A' reach α_K/σ (10⁴ with the
defaults), ξ_ii becomes large and negative and u_i extrapolates far from every model; the
round's metrics report ``self_attention_mean`` and ``attention_max`` to show it.

Partial participation works: the server mixes the stale w_j of clients that sat out;
clients that never uploaded have no model at the server and send no message (ξ_ij = 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from rayfed.algorithms.common.architecture import require_homogeneous, sole_architecture
from rayfed.algorithms.common.own_models import save_model_state, saved_model
from rayfed.algorithms.common.proximal import proximal_term
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.hooks import ClientHalf, Contribution, RoundContext, ServerHalf, Start
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.phase import Batch, Constants, Outputs, Params, Phase
from rayfed.train.problem import ProblemSpec
from rayfed.train.stack_layout import logical_rows
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_choice, check_real

__all__ = [
    "FedAMPParams",
    "pairwise_sq_distances",
    "attention_weights",
    "cloud_models",
    "CloudModels",
    "FedAMPClient",
    "FedAMPServer",
]

COLUMN_CHUNK = 1 << 16
"""Columns of the (M, S) model matrix per float64 product (bounds the temporary copies)."""


@section("algorithm.params")
@dataclass(frozen=True)
class FedAMPParams:
    """Hyper-parameters of FedAMP (``algorithm.params.*``); defaults of the cwFedAvg papers' baseline."""

    alpha_k: float = documented(
        1000.0, "α_K, the message-passing step size (Eq. 7) and the divisor of the proximal weight (Eq. 8)."
    )
    lamda: float = documented(1.0, "λ, the weight of the attention regulariser; the client's prox weight is λ/α_K.")
    sigma: float = documented(0.1, "σ of A(x) = 1 − exp(−x/σ), so A'(x) = exp(−x/σ)/σ.")
    start: Literal["own", "cloud"] = documented(
        "own", "Where the proximal step starts: own = the client's last model (PFLlib), cloud = u_i."
    )

    def __post_init__(self) -> None:
        p = "algorithm.params."
        check_choice(p + "start", self.start, ("own", "cloud"))
        check_real(p + "alpha_k", self.alpha_k, low=0, low_open=True)
        check_real(p + "lamda", self.lamda, low=0)
        check_real(p + "sigma", self.sigma, low=0, low_open=True)


# --- the equations: pure functions on the (M, S) model matrix ----------------------------------


def pairwise_sq_distances(models: np.ndarray) -> np.ndarray:
    """(M, M) float64 ‖w_i − w_j‖² of the rows of ``models``, from one Gram matrix product.

    The rows are centred first (distances do not change) and multiplied in float64, column
    chunk by chunk, so models that differ little are not lost to cancellation.
    """
    centre = models.mean(axis=0, dtype=np.float64)
    gram = np.zeros((models.shape[0], models.shape[0]), dtype=np.float64)
    for start in range(0, models.shape[1], COLUMN_CHUNK):
        block = models[:, start : start + COLUMN_CHUNK].astype(np.float64) - centre[start : start + COLUMN_CHUNK]
        gram += block @ block.T
    norms = np.diag(gram)
    distances = np.maximum(norms[:, None] + norms[None, :] - 2.0 * gram, 0.0)
    np.fill_diagonal(distances, 0.0)
    return distances


def attention_weights(distances: np.ndarray, sources: np.ndarray, alpha_k: float, sigma: float) -> np.ndarray:
    """ξ (M, M) of Eq. 7: ξ_ij = α_K · exp(−d_ij/σ)/σ for j ≠ i among ``sources`` (the clients whose
    model the server holds; 0 for the others), and ξ_ii = 1 − Σ_{j≠i} ξ_ij, so every row sums to 1."""
    xi = alpha_k * np.exp(-distances / sigma) / sigma
    xi[:, ~np.asarray(sources, dtype=bool)] = 0.0
    np.fill_diagonal(xi, 0.0)
    np.fill_diagonal(xi, 1.0 - xi.sum(axis=1))
    return xi


def cloud_models(xi: np.ndarray, models: np.ndarray) -> np.ndarray:
    """U = ξ W (Eq. 7), u_i = Σ_j ξ_ij w_j, as float32; the product runs in float64 per column chunk
    (ξ_ii can be large and negative, and the rows nearly equal)."""
    out = np.empty_like(models, dtype=np.float32)
    for start in range(0, models.shape[1], COLUMN_CHUNK):
        out[:, start : start + COLUMN_CHUNK] = xi @ models[:, start : start + COLUMN_CHUNK].astype(np.float64)
    return out


# --- worker side ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CloudModels:
    """Every client's cloud model u_i (one row each); a client downloads only its own row."""

    clouds: np.ndarray
    initial: np.ndarray
    """The common initial model, which a client holds until it first trains."""


class FedAMPClient(ClientHalf[FedAMPParams, CloudModels]):
    """Receives u_i and starts from it (or from its own w_i), trains on cross-entropy + (λ/(2α_K))‖w − u_i‖²
    (Eq. 8), keeps w_i for evaluation and uploads it whole (parameters, then buffers)."""

    def start(self, message: CloudModels, job: ClientJob) -> Start:
        """u_i, or (``start="own"``) the client's own w_i."""
        if self.params.start == "own":
            return Start(saved_model(job, message.initial))
        return Start(message.clouds[job.client_id])

    def phases(self, message: CloudModels, job: ClientJob) -> list[Phase]:
        if self.params.lamda == 0:
            return super().phases(message, job)
        cloud = to_device([message.clouds[job.client_id]], job.device)[0]
        return [
            Phase(
                epochs=job.train.local_epochs,
                loss=self.attraction,
                constants={"cloud": logical_rows(cloud[None], job.flat.layout)[0]},
            )
        ]

    def upload(self, message: CloudModels, job: ClientJob) -> Contribution:
        save_model_state(job)
        return ClientVectors.of(job.trained.clone(), job.client_id, job.num_train)

    def evaluation(self, message: CloudModels, job: ClientJob) -> np.ndarray:
        """The client's own w_i, its last trained model (the initial model if it never trained)."""
        return saved_model(job, message.initial)

    def bytes_down(self, message: CloudModels, job: ClientJob) -> int:
        return int(message.clouds[job.client_id].nbytes)

    def attraction(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        """(λ/(2α_K))‖w − u_i‖² (Eq. 8)."""
        return proximal_term(params, constants["cloud"], self.params.lamda / self.params.alpha_k)


# --- server side ----------------------------------------------------------------------------


class FedAMPServer(ServerHalf[FedAMPParams, ClientVectors]):
    """Keeps W, every client's latest model (the common initial one until it first uploads);
    after each round replaces the uploaders' rows and forms U = ξ W for the next round."""

    @classmethod
    def validate(cls, params: FedAMPParams, spec: ProblemSpec) -> None:
        require_homogeneous(spec)

    def __init__(self, params: FedAMPParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        architecture = sole_architecture(spec)
        self.num_params = spec.layouts[architecture].size
        self.initial = np.asarray(initial[architecture], dtype=np.float32)
        self.models = np.tile(self.initial, (spec.num_clients, 1))
        self.seen = np.zeros(spec.num_clients, dtype=bool)
        self.clouds = self.models.copy()
        self.xi = np.eye(spec.num_clients)

    def broadcast(self) -> CloudModels:
        return CloudModels(self.clouds, self.initial)

    def aggregate(self, ctx: RoundContext, contribution: ClientVectors) -> dict[str, float]:
        self.models = self.models.copy()  # the last broadcast may still be read
        self.models[contribution.client_ids] = contribution.matrix()
        self.seen[contribution.client_ids] = True
        self._mix()
        off = self.xi[~np.eye(len(self.xi), dtype=bool)]
        return {
            "clients_aggregated": float(contribution.count),
            "self_attention_mean": float(np.diag(self.xi).mean()),
            "attention_max": float(off.max()) if off.size else 0.0,
        }

    def _mix(self) -> None:
        """ξ from the parameter distances (buffers, e.g. BatchNorm statistics, are mixed but not compared)."""
        distances = pairwise_sq_distances(self.models[:, : self.num_params])
        self.xi = attention_weights(distances, self.seen, self.params.alpha_k, self.params.sigma)
        self.clouds = cloud_models(self.xi, self.models)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"models": self.models, "seen": self.seen.astype(np.uint8)}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.models = np.array(state["models"], dtype=np.float32)
        self.seen = np.asarray(state["seen"]).astype(bool)
        if self.seen.any():
            self._mix()
        else:
            self.clouds, self.xi = self.models.copy(), np.eye(len(self.models))


register_algorithm(
    "fedamp",
    params=FedAMPParams,
    server=FedAMPServer,
    client=FedAMPClient,
    summary="FedAMP (Huang et al. 2021): attention-weighted personal cloud model per client + proximal term",
    keeps_client_state=True,
    reporting=Reporting(label="FedAMP"),
)
