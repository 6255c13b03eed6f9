"""FedAWA and FedAWA-L: aggregation weights learnt on the server from client vectors.

Shi et al., "FedAWA: Adaptive Optimization of Aggregation Weights in Federated Learning
Using Client Vectors", CVPR 2025, Sec. 4.3-4.4 and Alg. 1. Each round the clients send
their client vectors τ_k = θ_k − θ_g (Eq. 1); the server refines learnable aggregation
weights λ on an objective of the client vectors (Eq. 3; per layer for FedAWA-L, Eq. 4)
and aggregates θ_g ← Σ_k λ_k θ_k (Alg. 1, lines 12-14). The objectives, their M × M
form and the solvers are in :mod:`rayfed.algorithms.fedawa_objective`.

**Three fidelities** (``algorithm.params.fidelity``):

* ``code`` (default): what the authors' code does (docs/algorithms.md, FedAWA section).
  Logits z, one per client id (per layer and client for FedAWA-L), start from the
  initial weights themselves (not their log) and are kept across rounds. Each round a
  new Adam (``server_lr`` 1e-3, betas (0.5, 0.999)) takes ``server_steps`` = 1 step on
  the code's loss Σ_k λ_k ‖τ_k − τ_g‖ + Σ_k λ_k C_k, λ = softmax(z), with C_k = d(θ_k, θ_g)
  held constant (:func:`~rayfed.algorithms.fedawa_objective.code_objective`), and the
  model is aggregated with the softmax computed *before* the last step:
  θ_g ← γ Σ_k λ_k θ_k / Σ_k λ_k. The step moves every logit by about ±``server_lr``, so
  the weights drift slowly away from the near-uniform softmax of the size fractions.
* ``paper``: the paper's procedure as written. The logits start at log λ⁰ (Alg. 1,
  line 1: λ⁰_k = n_k / Σn, so softmax(z) = λ⁰), are kept across rounds, and each round a
  new Adam takes ``server_steps`` steps on Eq. 3 itself, d applied to the aggregated
  parameters Σ_k λ_k θ_k (:func:`~rayfed.algorithms.fedawa_objective.paper_objective`);
  the model is aggregated with the weights *after* the steps, as Alg. 1 line 13 uses
  the optimised λ. It differs from ``code`` in three ways: the initial softmax is λ⁰
  itself, not nearly uniform; the regulariser is d(Σλθ, θ_g), not Σ λ_k d(θ_k, θ_g);
  and the round's own step already moves the weights it aggregates with.
* ``exact``: a diagnostic, never a default. Eq. 3 minimised on the simplex to a
  stationary point each round (:func:`~rayfed.algorithms.fedawa_objective.minimise_on_simplex`),
  warm-started from the clients' previous weights. It collapses: the first term of
  Eq. 3 is zero at every vertex of the simplex (λ = e_k gives τ_g = τ_k), so the
  minimiser puts (almost) all weight on one client, usually the one that moved least,
  and the warm start keeps it there. The server warns when it happens.

**Initial weights** (``initial_weights``): a named initialiser of
:mod:`rayfed.algorithms.fedawa_weights` (``size``: n_k / Σn, Alg. 1; ``uniform``), so
another method's weights can start the refinement, as in the paper's modularity
experiment (Sec. 5.3, FedDisco). A client seen for the first time starts from its
initialiser weight; weights and logits are indexed by client id, so under partial
participation every client keeps its own (the code re-uses a list by position).

**What a layer is (FedAWA-L).** One parameter tensor (``conv1.weight``, ``bn1.bias``, …).
A module's floating-point buffers (BatchNorm running mean and variance) are aggregated
with the weights of that module's ``weight`` tensor (its ``bias`` if it has none; the
mean over layers if it has neither). FedAWA aggregates buffers with its single λ, as the
code does. The objectives read parameters only, as the code's ``flat_w`` does. Every
fidelity aggregates every state entry with the round's weights and γ.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from rayfed.algorithms.common.architecture import sole_architecture
from rayfed.algorithms.common.global_model import GlobalModel, GlobalModelServer
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.fedawa_objective import (
    EXACT_SMOOTHING,
    ClientVectorProducts,
    MatrixFreeProducts,
    code_objective,
    combine,
    gram_statistics,
    layer_groups,
    paper_objective,
)
from rayfed.algorithms.fedawa_solvers import adam_steps, minimise_on_simplex, softmax
from rayfed.algorithms.fedawa_weights import INITIAL_WEIGHTS, needs_label_counts
from rayfed.algorithms.hooks import Contribution, RoundContext
from rayfed.algorithms.private_uploads import UploadBeyondModel
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.algorithms.sgdm import PersistentMomentumClient
from rayfed.algorithms.sizing import StateSizes, momentum_bytes
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_choice, check_int, check_real

if TYPE_CHECKING:
    from rayfed.train.settings import TrainConfig

logger = logging.getLogger(__name__)

__all__ = ["FIDELITIES", "FedAWAParams", "FedAWAModel", "FedAWAClient", "FedAWAServer", "FedAWALServer"]

FIDELITIES = ("code", "paper", "exact")


# --- hyper-parameters ---------------------------------------------------------------------------


@section("algorithm.params")
@dataclass(frozen=True)
class FedAWAParams:
    """Hyper-parameters of FedAWA and FedAWA-L (``algorithm.params.*``); see the module docstring."""

    fidelity: Literal["code", "paper", "exact"] = documented(
        "code", "code: the authors' code (default); paper: Alg. 1 with Adam on Eq. 3; exact: a diagnostic."
    )
    distance: Literal["cos", "euclidean", "none"] = documented(
        "cos",
        "d of Eq. 3: 1 − cosine similarity (the paper's choice), Euclidean, or none (no regulariser: Sec. 5.3, "
        "Tab. 5). paper, exact: d = ‖Σλθ − θ_g‖₂; code: C_k = mean over coordinates of (θ_g − θ_k)².",
    )
    initial_weights: str = documented(
        "size",
        "λ⁰: a name from rayfed.algorithms.fedawa_weights.INITIAL_WEIGHTS (size, uniform, feddisco: FedDisco's "
        "weights, Sec. 5.3; its clients then also upload their label histograms).",
    )
    server_steps: int = documented(
        1, "code, paper: Adam steps per round (the code's --server_epochs); a new Adam every round."
    )
    server_lr: float = documented(1e-3, "code, paper: Adam learning rate on the logits (the code's --server_lr).")
    server_beta1: float = documented(0.5, "code, paper: Adam's β1 (0.5, as the code).")
    server_beta2: float = documented(0.999, "code, paper: Adam's β2 (0.999, as the code).")
    gamma: float = documented(1.0, "γ of the code's update θ_g ← γ Σ λ_k θ_k / Σ λ_k (every fidelity; 1 = none).")
    tolerance: float = documented(
        1e-4,
        "exact only: stop once the Frank–Wolfe gap of every problem is at most tolerance × its objective at the "
        "start of the round.",
    )
    max_steps: int = documented(200, "exact only: at most this many projected-gradient steps per round.")

    def __post_init__(self) -> None:
        p = "algorithm.params."
        check_choice(p + "fidelity", self.fidelity, FIDELITIES)
        check_choice(p + "distance", self.distance, ("cos", "euclidean", "none"))
        check_choice(p + "initial_weights", self.initial_weights, INITIAL_WEIGHTS.names())
        for name in ("server_steps", "max_steps"):
            check_int(p + name, getattr(self, name), low=1)
        for name in ("server_lr", "gamma", "tolerance"):
            check_real(p + name, getattr(self, name), low=0, low_open=True)
        for name in ("server_beta1", "server_beta2"):
            check_real(p + name, getattr(self, name), low=0, high=1, high_open=True)

    def label(self, method: str) -> str:
        """``FedAWA (code)``, ``FedAWA-L (paper, 5 steps)``, ...: the display name of a run."""
        steps = f", {self.server_steps} steps" if self.server_steps != 1 and self.fidelity != "exact" else ""
        return f"{method} ({self.fidelity}{steps})"


# --- what clients upload ------------------------------------------------------------------------


@dataclass(frozen=True)
class FedAWAModel(GlobalModel):
    """The global model, and whether the clients send their training-label counts (the initial weights read
    them)."""

    send_label_counts: bool = False
    norm_slices: tuple[slice, ...] = ()
    """The parameter ranges of the groups of λ, whose squared norms the clients' workers make (one pass over
    the uploads fewer on the server: :class:`~rayfed.algorithms.fedawa_objective.MatrixFreeProducts`); none
    where the server forms the Gram matrix, whose diagonal holds them."""


class FedAWAClient(PersistentMomentumClient):
    """SGD with persistent momentum (:mod:`rayfed.algorithms.sgdm`); a trained client sends its client vector
    τ_k = θ_k − θ_g (and, if asked, its training-label counts)."""

    def upload(self, message: GlobalModel, job: ClientJob) -> Contribution:
        assert isinstance(message, FedAWAModel)
        counts = job.train_label_counts if message.send_label_counts else None
        vector = job.trained - to_device([message.vector], job.device)[0]
        return ClientVectors.of(vector, job.client_id, job.num_train, counts, message.norm_slices)


# --- the server half ----------------------------------------------------------------------------


class FedAWAServer(StateSizes, UploadBeyondModel, GlobalModelServer[FedAWAParams, ClientVectors]):
    """Keeps θ_g and, per client id, its logit (``code``, ``paper``) or weight (``exact``); one group of λ."""

    beyond_model = "their client vectors τ_k = θ_k − θ_g one by one (the server weighs each, not their sum)"

    layer_wise = False
    may_hold_nan = frozenset({"client_state"})  # NaN: a client not seen yet

    @classmethod
    def client_state_bytes(cls, params: FedAWAParams, spec: ProblemSpec, train: TrainConfig) -> int:
        """Its clients keep their SGD momentum buffers (:mod:`rayfed.algorithms.sgdm`)."""
        return momentum_bytes(spec, train)

    @classmethod
    def server_state_bytes(cls, params: FedAWAParams, spec: ProblemSpec) -> int:
        """θ_g and the sum of the round's updates, and one float64 weight per group of λ and client id."""
        architecture = sole_architecture(spec)
        groups = layer_groups(
            spec.layouts[architecture], spec.buffer_layouts.get(architecture), layer_wise=cls.layer_wise
        )
        return super().server_state_bytes(params, spec) + 8 * groups.num_groups * spec.num_clients

    def __init__(self, params: FedAWAParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        self.groups = layer_groups(
            spec.layouts[self.architecture], spec.buffer_layouts.get(self.architecture), layer_wise=self.layer_wise
        )
        covered = max(s.stop for s, _ in self.groups.segments)
        if covered != self.global_vector.size:
            raise ValueError(
                f"{spec.algorithm or 'fedawa'}: the state has {self.global_vector.size} floats but the layout covers "
                f"{covered}; ProblemSpec.buffer_layouts must describe the model's buffers"
            )
        self.client_state = np.full((self.groups.num_groups, spec.num_clients), np.nan)
        """Per group and client id: the logit (``code``, ``paper``) or weight (``exact``); NaN = not seen yet."""
        self._warned_vertex = False

    @property
    def matrix_free(self) -> bool:
        """One Adam step evaluates the objective once: two products with T beat forming T Tᵀ."""
        return self.params.fidelity != "exact" and self.params.server_steps == 1

    @property
    def norm_slices(self) -> tuple[slice, ...]:
        """The ranges whose squared norms the clients' workers make: the groups' parameters, when matrix-free."""
        return self.groups.param_slices if self.matrix_free else ()

    def broadcast(self) -> FedAWAModel:
        return FedAWAModel(self.global_vector, needs_label_counts(self.params.initial_weights), self.norm_slices)

    def aggregate(self, ctx: RoundContext, contribution: ClientVectors) -> dict[str, float]:
        ids = contribution.client_ids
        vectors = contribution.matrix()
        self._first_sight(ids, contribution.sizes, contribution.label_counts)
        if self.params.fidelity == "exact":
            lam, metrics, products = *self._exact_weights(ctx, vectors, ids), None
        else:
            lam, metrics, products = self._adam_weights(contribution, vectors)
        self.global_vector = combine(self.global_vector, vectors, lam, self.groups, self.params.gamma, products)
        metrics.update(clients_aggregated=float(len(ids)), fedawa_max_weight=float(lam.max(axis=1).mean()))
        return metrics

    def _adam_weights(
        self, contribution: ClientVectors, vectors: np.ndarray
    ) -> tuple[np.ndarray, dict[str, float], ClientVectorProducts]:
        """``code`` and ``paper``: Adam on the logits; returns the weights to aggregate with, the metrics and the
        products the objective read (which may hold the weighted sum :func:`combine` needs)."""
        p, ids = self.params, contribution.client_ids
        products: ClientVectorProducts
        if self.matrix_free:  # the workers' squared norms, if they made them for this server's groups
            norms = contribution.square_norms if contribution.norm_slices == self.norm_slices else None
            products = MatrixFreeProducts(vectors, self.global_vector, self.groups.param_slices, norms)
        else:
            products = gram_statistics(vectors, self.global_vector, self.groups.param_slices)
        if p.fidelity == "code":
            objective = code_objective(products, p.distance, self.groups.sizes)
        else:
            objective = paper_objective(products, p.distance)
        lam, value, self.client_state[:, ids] = adam_steps(
            objective,
            self.client_state[:, ids],
            steps=p.server_steps,
            lr=p.server_lr,
            betas=(p.server_beta1, p.server_beta2),
        )
        if p.fidelity == "paper":  # Alg. 1 aggregates with the optimised weights
            lam = softmax(self.client_state[:, ids])
        return lam, {"fedawa_objective": float(value.mean())}, products

    def _exact_weights(
        self, ctx: RoundContext, vectors: np.ndarray, ids: np.ndarray
    ) -> tuple[np.ndarray, dict[str, float]]:
        """``exact``: the minimiser of Eq. 3 on the simplex, warm-started from the previous weights."""
        p = self.params
        mass = self.client_state[:, ids].sum(axis=1, keepdims=True)
        stats = gram_statistics(vectors, self.global_vector, self.groups.param_slices)
        lam, report = minimise_on_simplex(
            paper_objective(stats, p.distance, smoothing=EXACT_SMOOTHING),
            self.client_state[:, ids] / mass,
            tolerance=p.tolerance,
            max_steps=p.max_steps,
        )
        self.client_state[:, ids] = lam * mass
        if len(ids) > 1 and lam.max() > 0.99 and not self._warned_vertex:
            self._warned_vertex = True
            logger.warning(
                "round %d: fidelity='exact' put %.3f of the weight on one client: the exact minimiser of Eq. 3 "
                "lies at a vertex of the simplex (its first term vanishes there). It is a diagnostic; "
                "fidelity='code' (the default) and 'paper' take Adam steps on learnable weights instead",
                ctx.round,
                float(lam.max()),
            )
        relative_gap = float((report.gap / np.maximum(np.abs(report.start), 1e-300)).max())
        if relative_gap > p.tolerance:
            logger.debug(
                "round %d: solver stopped after %d steps, relative gap %.3g", ctx.round, report.steps, relative_gap
            )
        return lam, {
            "fedawa_objective_start": float(report.start.mean()),
            "fedawa_objective": float(report.final.mean()),
            "fedawa_solver_steps": float(report.steps),
            "fedawa_solver_gap": relative_gap,
        }

    def _first_sight(self, ids: np.ndarray, sizes: np.ndarray, label_counts: np.ndarray | None = None) -> None:
        """Clients never aggregated before start from their initial weight w: z = w (``code``, as the code
        does with the size fractions), z = log w (``paper``), λ = w (``exact``)."""
        new = np.isnan(self.client_state[0, ids])
        if new.any():
            weights = INITIAL_WEIGHTS.get(self.params.initial_weights)(ids, sizes, label_counts, self.spec)[new]
            if self.params.fidelity == "paper":  # a weight of 0 becomes a finite, negligible logit
                weights = np.log(np.maximum(weights, np.finfo(np.float64).tiny))
            self.client_state[:, ids[new]] = weights
        if self.params.fidelity == "exact":  # a subset whose weights all went to 0 restarts uniform
            empty = self.client_state[:, ids].sum(axis=1) <= 0
            self.client_state[np.ix_(empty, ids)] = 1.0 / self.spec.num_clients

    def extra_state(self) -> dict[str, np.ndarray]:
        return {"client_state": self.client_state}

    def load_extra_state(self, state: Mapping[str, np.ndarray]) -> None:
        self.client_state = np.array(state["client_state"], dtype=np.float64)


class FedAWALServer(FedAWAServer):
    """FedAWA-L (Eq. 4): one λ per layer (parameter tensor), solved as one batch."""

    layer_wise = True


register_algorithm(
    "fedawa",
    params=FedAWAParams,
    server=FedAWAServer,
    client=FedAWAClient,
    summary="FedAWA (Shi et al. 2025): aggregation weights learnt from client vectors (Eq. 3); "
    "fidelity=code (default), paper or exact",
    keeps_client_state=True,
    reporting=Reporting(label=lambda params: params.label("FedAWA"), single_model=True),
)
register_algorithm(
    "fedawa_l",
    params=FedAWAParams,
    server=FedAWALServer,
    client=FedAWAClient,
    summary="FedAWA-L (Shi et al. 2025): layer-wise aggregation weights from client vectors (Eq. 4); "
    "fidelity=code (default), paper or exact",
    keeps_client_state=True,
    reporting=Reporting(label=lambda params: params.label("FedAWA-L"), single_model=True),
)
