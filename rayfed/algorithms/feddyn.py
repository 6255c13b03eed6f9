"""FedDyn: federated learning with a dynamic regulariser per client and a server correction.

Acar, Zhao, Matas, Mattina, Whatmough and Saligrama, "Federated Learning Based on Dynamic
Regularization", ICLR 2021, arXiv:2111.04263 (Algorithm 1). See docs/algorithms.md, FedDyn section.

Client k, sampled in round t, starts from θ^{t−1} and minimises (Algorithm 1, client step)

    L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2) ‖θ − θ^{t−1}‖²

then updates its gradient state (first-order condition of that minimum)

    ∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α (θ_k^t − θ^{t−1}).

The server, with P_t the round's clients and m the number of all clients, updates

    h^t = h^{t−1} − α (1/m) Σ_{k∈P_t} (θ_k^t − θ^{t−1}),
    θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t − (1/α) h^t.

That is ``fidelity="paper"``. ``fidelity="code"`` (default) is the FedAWA paper's baseline code
(``ZexiLee/ICML-2023-FedLAW``: ``client_funct.client_feddyn``, ``server_funct.feddyn``): the
quadratic term is (α/2)‖θ − θ^{t−1}‖ (not squared), the server averages with the size weights
w_k = n_k / Σ_{j∈P_t} n_j in both lines (h^t = h^{t−1} − α Σ w_k (θ_k^t − θ^{t−1}),
θ^t = Σ w_k θ_k^t − h^t/α), and the clients' SGD momentum persists across rounds (the node's
optimiser is created once), as FedAWA's clients.

The gradient state (P floats, starting at 0) is kept in the client state store under
``"feddyn_grad"`` (flat-vector order), so only sampled clients update it. The two loss terms
are one phase's loss (:meth:`FedDynClient.dynamic`), and under ``code`` the momentum buffer persists
in the client state (key ``"momentum"``, ``SGD.keep_momentum``); both fidelities train stacked. h and the
correction act on the parameters; floating-point buffers (BatchNorm statistics) take the clients' average.
Clients upload θ_k as a declared :class:`WeightedState` of weight n_k (``code``) or 1 (``paper``); the server's
|P_t| is the sum's weight (the count of clients weighted 1).

With privacy (docs/privacy.md) the server half declares :class:`ModelUpload`: the worker clips θ_k − θ^{t−1} (and
with local DP noises it), the server completes the sum to the planned weight and noises it, and both of the server's
lines read only that protected sum: the mean model, and |P_t| as the planned weight W_P (the plan's count under
``privacy.weighting='uniform'``), never who reported. The gradient state ∇L_k is the client's own, never uploaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from rayfed.algorithms.common.global_model import GlobalModel, GlobalModelServer
from rayfed.algorithms.common.proximal import flatten_logically, proximal_term
from rayfed.algorithms.contributions import WeightedState, WeightedSum
from rayfed.algorithms.hooks import RoundContext
from rayfed.algorithms.private_uploads import ModelUpload
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.algorithms.sgdm import MOMENTUM_KEY, PersistentMomentumClient
from rayfed.algorithms.sizing import StateSizes, momentum_bytes, parameter_bytes
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.phase import SGD, Batch, Constants, Outputs, Params, Phase
from rayfed.train.problem import ProblemSpec
from rayfed.train.stack_layout import logical_rows
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_choice, check_real

if TYPE_CHECKING:
    from rayfed.train.settings import TrainConfig

__all__ = ["GRAD_KEY", "FedDynParams", "FedDynModel", "FedDynClient", "FedDynServer", "feddyn_server_step"]

GRAD_KEY = "feddyn_grad"
"""Name of the client's gradient state ∇L_k (P floats, flat-vector order) in its state."""


@section("algorithm.params")
@dataclass(frozen=True)
class FedDynParams:
    """Hyper-parameters of FedDyn (``algorithm.params.*``)."""

    alpha: float = documented(
        0.001,
        "α of the regulariser and the server correction; 0.001 as the FedAWA paper's baseline code "
        "(the FedDyn paper uses 0.1, 0.01 or 0.001 by task).",
    )
    fidelity: Literal["code", "paper"] = documented(
        "code",
        "code: the FedAWA paper's baseline code (unsquared norm, size-weighted server, persistent "
        "momentum); paper: Algorithm 1 (squared norm, unweighted mean, 1/m in h).",
    )

    def __post_init__(self) -> None:
        check_real("algorithm.params.alpha", self.alpha, low=0, low_open=True)
        check_choice("algorithm.params.fidelity", self.fidelity, ("code", "paper"))


def feddyn_server_step(
    theta: np.ndarray,
    h: np.ndarray,
    mean_model: np.ndarray,
    count: float,
    num_clients: int,
    alpha: float,
    fidelity: str = "paper",
) -> tuple[np.ndarray, np.ndarray]:
    """(θ^t, h^t) from θ^{t−1}, h^{t−1}, the mean of the round's models and |P_t| (Algorithm 1, server
    step: unweighted mean, h scaled by |P_t|/m); ``code``: the size-weighted mean, h moved by α times
    its change (the baseline code); every array holds parameters only. With privacy ``mean_model`` is the noised
    mean and ``count`` the planned count."""
    change = mean_model.astype(np.float64) - theta
    summed_change = change if fidelity == "code" else count * change / num_clients
    h = h - alpha * summed_change
    return (mean_model - h / alpha).astype(np.float32), h.astype(np.float32)


def _grad_state(job: ClientJob) -> np.ndarray:
    """The client's ∇L_k(θ_k^{t−1}); zeros before its first round."""
    saved = (job.state or {}).get(GRAD_KEY)
    size = job.flat.size
    return np.asarray(saved, np.float32) if saved is not None and saved.shape == (size,) else np.zeros(size, np.float32)


@dataclass(frozen=True)
class FedDynModel(GlobalModel):
    """θ^{t−1}, with α and whether clients weigh their upload by n_k (``code``) or 1 (``paper``)."""

    alpha: float = 0.001
    size_weighted: bool = False


class FedDynClient(PersistentMomentumClient):
    """Adds −⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖² (``code``: ‖·‖ unsquared) to each mini-batch's loss;
    ``code`` keeps the SGD momentum buffer across the client's rounds. A trained client updates its gradient
    state and sends θ_k^t with weight n_k (``code``) or 1 (``paper``)."""

    params: FedDynParams

    def phases(self, message: GlobalModel, job: ClientJob) -> list[Phase]:
        """One phase of CE plus the dynamic regulariser; ``code`` keeps the momentum buffer (a fresh one every
        round under ``paper``)."""
        grad = logical_rows(to_device([_grad_state(job)], job.device)[0].unsqueeze(0), job.flat.layout)[0]
        optimizer = SGD(keep_momentum=MOMENTUM_KEY) if self.params.fidelity == "code" else SGD()
        return [
            Phase(
                epochs=job.train.local_epochs,
                loss=self.dynamic,
                optimizer=optimizer,
                constants={"grad": grad},
            )
        ]

    def dynamic(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        """−⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖² (``code``: the norm unsquared), θ^{t−1} = the round's start."""
        linear = torch.dot(flatten_logically(list(params)), constants["grad"])
        if self.params.fidelity == "code":
            drift = torch.linalg.vector_norm(flatten_logically(list(params)) - constants["start"])
            return 0.5 * self.params.alpha * drift - linear
        return proximal_term(list(params), constants["start"], self.params.alpha) - linear

    def upload(self, message: GlobalModel, job: ClientJob) -> WeightedState:
        """∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α(θ_k^t − θ^{t−1}) into the client's state; θ_k^t weighted, declared."""
        assert isinstance(message, FedDynModel)
        p, trained = job.worker_model.size, job.trained
        start, grad = to_device([message.vector[:p], _grad_state(job)], job.device)
        change = trained[:p] - start
        job.state = {**(job.state or {}), GRAD_KEY: grad - np.float32(message.alpha) * change}
        return WeightedState(unit_weights=not message.size_weighted)


class FedDynServer(ModelUpload, StateSizes, GlobalModelServer[FedDynParams, WeightedSum]):
    """Keeps θ and the server state h (parameters). Its clients upload their trained model whole
    (:class:`ModelUpload`), so privacy protects it as FedAvg's."""

    @classmethod
    def privacy_conflict(cls, params: FedDynParams, privacy: Any) -> str:
        """``paper``'s unweighted mean and its |P_t| count clients weighted 1, which ``privacy.weighting='samples'``
        would weigh by their samples."""
        if params.fidelity == "paper" and privacy.weighting == "samples":
            return (
                "algorithm.params.fidelity='paper' averages FedDyn's clients unweighted and counts them in h, but "
                "privacy.weighting='samples' weighs them by their samples: set privacy.weighting='uniform' or "
                "algorithm.params.fidelity='code'"
            )
        return ""

    @classmethod
    def client_state_bytes(cls, params: FedDynParams, spec: ProblemSpec, train: TrainConfig) -> int:
        """The gradient state (parameters), plus the momentum buffer under ``code`` with ``train.momentum`` > 0."""
        return parameter_bytes(spec) + (momentum_bytes(spec, train) if params.fidelity == "code" else 0)

    def __init__(self, params: FedDynParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        self.num_params = spec.layouts[self.architecture].size
        self.h = np.zeros(self.num_params, np.float32)

    def broadcast(self) -> FedDynModel:
        return FedDynModel(self.global_vector, self.params.alpha, self.params.fidelity == "code")

    def privacy_reference(self) -> np.ndarray:
        """θ^{t−1}, the model every client of the round started from (:class:`ModelUpload`)."""
        return self.global_vector

    def aggregate(self, ctx: RoundContext, contribution: WeightedSum) -> dict[str, float]:
        """The server step from the mean of the uploads and |P_t|, the sum's weight (``paper``: each client 1; with
        privacy the planned weight): both from the sum alone."""
        mean = contribution.average()
        p = self.num_params
        theta, self.h = feddyn_server_step(
            self.global_vector[:p],
            self.h,
            mean[:p],
            contribution.weight,
            self.spec.num_clients,
            self.params.alpha,
            self.params.fidelity,
        )
        self.global_vector = np.concatenate([theta, mean[p:]]).astype(np.float32, copy=False)
        return {"clients_aggregated": float(contribution.count), "feddyn_h_norm": float(np.linalg.norm(self.h))}

    def extra_state(self) -> dict[str, np.ndarray]:
        return {"h": self.h}

    def load_extra_state(self, state: Mapping[str, np.ndarray]) -> None:
        self.h = np.array(state["h"], dtype=np.float32)


register_algorithm(
    "feddyn",
    params=FedDynParams,
    server=FedDynServer,
    client=FedDynClient,
    summary="FedDyn (Acar et al. 2021): dynamic regulariser -<grad_k, w> + (alpha/2)||w - w_g||^2, server state h",
    keeps_client_state=True,
    reporting=Reporting(label="FedDyn", single_model=True),
)
