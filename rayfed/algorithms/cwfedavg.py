"""cwFedAvg with WDR: class-wise federated averaging, personalised by estimated class distributions.

Lee & Choi, "Class-Wise Federated Averaging for Efficient Personalization", ICCV 2025
(seed 000, "P-ICCV"); earlier version "Regularizing and Aggregating Clients with Class
Distribution for Personalized Federated Learning", arXiv:2406.07800 (seed 003, "P-arXiv").
Reference code: github.com/regulationLee/cwFedAvg (``serveravgCW.py``, ``clientavgCW.py``).
Spec: ``docs/algorithms.md`` §1.

One round, as the engine runs it (P-ICCV Algorithm 1)::

    worker:  θ_i^cw ← Σ_j p̃_ij G_j,  θ_i^other ← G_avg                   Eq. 7
             train θ_i on CE + c·‖p_i − p̃_i(W_i)‖₂ at every mini-batch      Eq. 8
             p̃_ij = ‖W_i[j,:]‖₂ / Σ_k ‖W_i[k,:]‖₂   (output-layer weight)   Eq. 4
             send Σ_i n_i p̃_ij θ_i^cw, Σ_i n_i p̃_ij, the FedAvg sums of θ_i^other, the rows p̃_i
    server:  G_j ← Σ_i n_i p̃_ij θ_i^cw / Σ_i n_i p̃_ij                    Eq. 6
             G_avg ← Σ_i n_i θ_i^other / Σ_i n_i                            (FedAvg)
             store the rows p̃_i, broadcast (G, G_avg, p̃) for the next round

Which layers are class-wise (``classwise_blocks``, P-ICCV §4.3, Table 3): the last m
top-level blocks of the model; 0 means the whole model (P-arXiv's all-layer method).
The rest goes through FedAvg.

Differences from the authors' code, all deliberate:

* partial participation (join ratio < 1) works: sums run over the uploaded clients
  only, and a client that did not train keeps its stale row p̃_i (the code crashes);
* a class whose denominator Σ_i n_i p̃_ij is zero keeps its previous G_j instead of
  becoming NaN (only possible with ``variant="dist"``);
* floating-point buffers (BatchNorm statistics) are never averaged, as in the code,
  and stay with their client (kept in the client state store).

``DISCREPANCY`` switches (spec §6): ``fidelity`` (WDR coefficient 0.5·λ in the code,
λ in the paper) and ``p_source`` (p_i over the pre-split partition in the code).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from rayfed.algorithms.base import (
    Broadcast,
    ClientHalf,
    Contribution,
    ProblemSpec,
    RoundContext,
    ServerHalf,
    register_algorithm,
)
from rayfed.algorithms.contributions import WeightedSum
from rayfed.algorithms.fedavg import require_homogeneous
from rayfed.errors import ConfigError
from rayfed.registry import closest
from rayfed.training import ClientJob

logger = logging.getLogger(__name__)

__all__ = [
    "CwFedAvgParams",
    "ModelParts",
    "model_parts",
    "estimate_class_distribution",
    "output_row_norms",
    "distribution_from_norms",
    "empirical_distribution",
    "classwise_partial_sums",
    "classwise_average",
    "classwise_aggregate",
    "personalise",
    "wdr_penalty",
    "ClasswiseSum",
    "ClasswiseModels",
    "CwFedAvgClient",
    "CwFedAvgServer",
]

_FIDELITIES = ("code", "paper")
_VARIANTS = ("wdr", "dist", "no_wdr")
_P_SOURCES = ("partition", "train")


# --- hyper-parameters ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CwFedAvgParams:
    """Hyper-parameters of cwFedAvg (``algorithm.params.*``)."""

    wdr_lambda: float = 10.0
    """λ of WDR (P-ICCV Eq. 8), as the code's ``-wd`` flag: 10 for MNIST/CIFAR-10, 1000 for
    CIFAR-100, 2000 for Tiny-ImageNet (P-ICCV §5.1)."""
    fidelity: Literal["code", "paper"] = "code"
    """``code``: the loss adds 0.5·λ·R, as both code versions do; ``paper``: λ·R (spec §1.5)."""
    variant: Literal["wdr", "dist", "no_wdr"] = "wdr"
    """``wdr``: p̃ from the output layer plus WDR; the server never sees p_i or n_ij.
    ``dist`` ("w/ Dist.", P-arXiv Tab. 1): the true p_i drives aggregation and
    personalisation and there is no WDR; clients then *send their label counts*, which
    the privacy-preserving method avoids. ``no_wdr`` ("w/o WDR"): p̃ without the regulariser."""
    classwise_blocks: int = 1
    """How many of the model's last top-level blocks are class-wise: 1 = "cwFedAvg (Output)"
    (P-ICCV default), 2 = FC+Output, 3 = Conv2+FC+Output, 0 = the whole model. The rest
    goes through FedAvg."""
    classwise_layers: tuple[str, ...] = ()
    """The class-wise blocks by name, e.g. ``("last_feat", "fc")`` for FC+Output; they must be
    the model's last blocks. Overrides ``classwise_blocks`` when given."""
    p_source: Literal["partition", "train"] = "partition"
    """Where p_i comes from: the client's whole partition before the 75/25 split (the
    code, spec §1.4) or its training split only."""

    def __post_init__(self) -> None:
        lam = self.wdr_lambda
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not (math.isfinite(lam) and lam >= 0):
            raise ConfigError(
                f"algorithm.params.wdr_lambda must be a finite number >= 0, but got algorithm.params.wdr_lambda={lam!r}"
            )
        for name, choices in (("fidelity", _FIDELITIES), ("variant", _VARIANTS), ("p_source", _P_SOURCES)):
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(
                    f"algorithm.params.{name} must be one of {', '.join(map(repr, choices))}, "
                    f"but got algorithm.params.{name}={value!r}"
                )
        m = self.classwise_blocks
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ConfigError(
                "algorithm.params.classwise_blocks must be an integer >= 0 (0 = all layers class-wise), "
                f"but got algorithm.params.classwise_blocks={m!r}"
            )

    def classwise_count(self, blocks: tuple[str, ...]) -> int:
        """How many trailing blocks of a model with ``blocks`` are class-wise (0 = all).

        Resolves ``classwise_layers`` by name; a name that is not a block of the model, or
        names that are not its last blocks, raise ConfigError listing the model's blocks.
        """
        names = tuple(self.classwise_layers)
        if not names:
            return self.classwise_blocks
        for name in names:
            if name not in blocks:
                raise ConfigError(
                    f"algorithm.params.classwise_layers names {name!r}, which is not a top-level block of the "
                    f"model{closest(name, blocks)}; the model's blocks are: {', '.join(blocks)}"
                )
        if set(names) != set(blocks[-len(names) :]):
            raise ConfigError(
                f"algorithm.params.classwise_layers={list(names)!r} must be the model's last blocks "
                f"(class-wise layers sit on top of the FedAvg ones, P-ICCV §4.3); the model's blocks are: "
                f"{', '.join(blocks)}, so e.g. {list(blocks[-len(names):])!r}"
            )
        return len(names)

    @property
    def wdr_coefficient(self) -> float:
        """c in loss = CE + c·R: 0.5·λ (code) or λ (paper) with WDR, else 0."""
        if self.variant != "wdr":
            return 0.0
        return (0.5 if self.fidelity == "code" else 1.0) * float(self.wdr_lambda)


# --- which part of the flat parameter vector is class-wise --------------------------------------


@dataclass(frozen=True)
class ModelParts:
    """Where the class-wise part, the FedAvg part and the output weight lie in the flat vector."""

    classwise: slice
    shared: tuple[slice, ...]
    """The FedAvg part: the parameters outside ``classwise`` (empty in all-layer mode)."""
    output_weight: slice
    output_shape: tuple[int, int]
    """(K, h) of the output layer's weight matrix W."""
    output_index: int
    """Index of W among the model's parameter tensors (``FlatModel.params``)."""

    @property
    def shared_size(self) -> int:
        return sum(s.stop - s.start for s in self.shared)

    def gather_shared(self, vector: np.ndarray) -> np.ndarray:
        return np.concatenate([vector[s] for s in self.shared]) if self.shared else vector[:0]


def model_parts(spec: ProblemSpec, architecture: str, params: CwFedAvgParams) -> ModelParts:
    """Split ``architecture``'s parameters into the class-wise blocks and the FedAvg rest (spec §1.6).

    Raises ConfigError naming ``algorithm.params.classwise_blocks`` (or ``classwise_layers``) if
    the model has fewer blocks or lacks a named one, or if its output layer does not have one
    row per class.
    """
    layout, blocks = spec.layouts[architecture], spec.blocks[architecture]
    classwise_blocks = params.classwise_count(tuple(blocks))
    if classwise_blocks > len(blocks):
        raise ConfigError(
            f"algorithm.params.classwise_blocks must be between 0 (all layers) and {len(blocks)}, the number of "
            f"top-level blocks of model {architecture!r} ({', '.join(blocks)}), but got "
            f"algorithm.params.classwise_blocks={classwise_blocks}"
        )
    shared: tuple[slice, ...] = ()
    if classwise_blocks in (0, len(blocks)):
        classwise = slice(0, layout.size)
    else:
        classwise = layout.slice_of(blocks[-classwise_blocks:])
        shared = tuple(s for s in (slice(0, classwise.start), slice(classwise.stop, layout.size)) if s.stop > s.start)
    name = f"{spec.output_layer[architecture]}.weight"
    index = layout.names.index(name)
    shape = layout.shapes[index]
    if len(shape) != 2 or shape[0] != spec.num_classes:
        raise ConfigError(
            f"cwFedAvg needs an output layer with one weight row per class, but {name} of model "
            f"{architecture!r} has shape {shape} for {spec.num_classes} classes"
        )
    return ModelParts(classwise, shared, layout.index(name), (shape[0], shape[1]), index)


# --- the math (pure functions) ------------------------------------------------------------------


def estimate_class_distribution(weight: torch.Tensor) -> torch.Tensor:
    """p̃_j = ‖W_j,:‖₂ / Σ_k ‖W_k,:‖₂ (P-ICCV Eq. 4, P-arXiv Eq. 9), differentiable.

    ``weight`` is the output layer's weight matrix (K, h), bias excluded, or a batch
    (..., K, h). Gradients flow through the row norms and through the normalising sum.
    """
    norms = torch.linalg.vector_norm(weight, dim=-1)
    return norms / norms.sum(dim=-1, keepdim=True)


def output_row_norms(weight: np.ndarray) -> np.ndarray:
    """r_j = ‖W_j,:‖₂, the numerator of P-ICCV Eq. 4, in float64; (..., K, h) -> (..., K)."""
    return np.linalg.norm(np.asarray(weight, dtype=np.float64), axis=-1)


def distribution_from_norms(norms: np.ndarray) -> np.ndarray:
    """p̃_j = r_j / Σ_k r_k (P-ICCV Eq. 4) from row norms (..., K); an all-zero row gives 1/K."""
    norms = np.asarray(norms, dtype=np.float64)
    total = norms.sum(axis=-1, keepdims=True)
    uniform = np.full_like(norms, 1.0 / norms.shape[-1])
    return np.divide(norms, total, out=uniform, where=total > 0)


def empirical_distribution(counts: np.ndarray) -> np.ndarray:
    """p_ij = n_ij / n_i (P-ICCV §3.2) from label counts (..., K); a client without samples gets 1/K."""
    return distribution_from_norms(counts)


def classwise_partial_sums(
    models: np.ndarray, sizes: np.ndarray, p_tilde: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Numerators and denominators of P-ICCV Eq. 6 over a set of clients.

    ``models`` (N, P) holds θ_i^cw, ``sizes`` (N,) the training counts n_i, ``p_tilde``
    (N, K) the rows p̃_i. Returns (Σ_i n_i p̃_ij θ_i, Σ_i n_i p̃_ij) as (K, P) float32 and
    (K,) float64. Both are sums over clients, so sets of clients add.
    """
    weights = np.asarray(sizes, dtype=np.float64)[:, None] * np.asarray(p_tilde, dtype=np.float64)
    numerators = weights.T.astype(np.float32) @ np.asarray(models, dtype=np.float32)
    return numerators, weights.sum(axis=0)


def classwise_average(numerators: np.ndarray, masses: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """G_j = Σ_i n_i p̃_ij θ_i / Σ_i n_i p̃_ij (P-ICCV Eq. 6), from the sums of
    :func:`classwise_partial_sums`. A class with zero mass keeps its ``previous`` G_j (no NaN)."""
    present = np.asarray(masses) > 0
    safe = np.where(present, masses, 1.0).astype(np.float32)
    averaged = numerators / safe[:, None]
    return np.where(present[:, None], averaged, previous).astype(np.float32, copy=False)


def classwise_aggregate(
    models: np.ndarray, sizes: np.ndarray, p_tilde: np.ndarray, previous: np.ndarray
) -> np.ndarray:
    """Class-wise local-model aggregation, P-ICCV Eq. 5-6 with p̃ for p:

        q_ij = n_i p̃_ij / Σ_i' n_i' p̃_i'j,   G_j = Σ_i q_ij θ_i

    ``models`` (N, P), ``sizes`` (N,), ``p_tilde`` (N, K), ``previous`` (K, P) -> (K, P).
    (The weights n_i/Σn of the paper cancel in q_ij.) A class no client has keeps its
    previous model.
    """
    return classwise_average(*classwise_partial_sums(models, sizes, p_tilde), previous)


def personalise(p_tilde: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Class-wise global-model aggregation, θ_i = Σ_j p̃_ij G_j (P-ICCV Eq. 7).

    ``p_tilde`` (K,) or (M, K), ``heads`` (K, P) -> (P,) or (M, P), as one matrix product.
    """
    return (np.asarray(p_tilde, dtype=np.float32) @ heads).astype(np.float32, copy=False)


def wdr_penalty(p: torch.Tensor, weight: torch.Tensor, coefficient: float) -> torch.Tensor:
    """Weight distribution regulariser, c·‖p_i − p̃_i(W)‖₂ (P-ICCV Eq. 8; L2, not squared).

    ``p`` (K,) is the client's empirical class distribution, ``weight`` the live output
    weight (K, h). c is λ in the paper and 0.5·λ in the authors' code.
    """
    return coefficient * torch.linalg.vector_norm(p - estimate_class_distribution(weight))


def _client_counts(job: ClientJob, p_source: str) -> np.ndarray:
    return np.asarray(job.label_counts if p_source == "partition" else job.train_label_counts)


def _client_distribution(job: ClientJob, p_source: str) -> np.ndarray:
    return empirical_distribution(_client_counts(job, p_source))


# --- what a worker uploads ----------------------------------------------------------------------


def _concat(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    return None if a is None or b is None else np.concatenate([a, b])


@dataclass
class ClasswiseSum(Contribution):
    """The sufficient statistics of Eq. 6 (and FedAvg) for a set of clients; ``+`` merges sets.

    Per set of clients: the K × P_cw sum Σ_i (n_i p̃_ij) θ_i^cw, the K masses Σ_i n_i p̃_ij,
    a :class:`WeightedSum` of the FedAvg part and, per client, its id, its row p̃_i and the
    row norms of its output weight (K floats each, for the figures). Nothing else: in the
    default variant the server never receives p_i or n_ij. Only ``variant="dist"`` fills
    ``label_counts`` (n_ij), and then ``rows`` holds p_i itself.

    One client's numerator is rank one, (n_i p̃_i) ⊗ θ_i^cw, so a single upload keeps just
    θ_i^cw (``model``; its masses are n_i p̃_i) and is as large as a FedAvg upload plus a
    few K-vectors, as the paper states (P-ICCV §4.3). The K × P_cw sum (``heads``) is
    formed when uploads are merged.
    """

    masses: np.ndarray
    shared: WeightedSum | None
    client_ids: np.ndarray
    rows: np.ndarray
    norms: np.ndarray
    label_counts: np.ndarray | None = None
    heads: np.ndarray | None = None
    """Σ_i (n_i p̃_ij) θ_i^cw, (K, P_cw); None while this is a single client's upload."""
    model: np.ndarray | None = None
    """θ_i^cw of a single client's upload; None once merged."""

    @classmethod
    def of_client(
        cls,
        client_id: int,
        num_train: int,
        row: np.ndarray,
        norms: np.ndarray,
        model: np.ndarray,
        shared: np.ndarray | None,
        label_counts: np.ndarray | None = None,
    ) -> ClasswiseSum:
        """One client's upload: θ_i^cw, n_i p̃_i (Eq. 6 weights), its FedAvg part, its row and norms."""
        return cls(
            masses=num_train * np.asarray(row, dtype=np.float64),
            shared=None if shared is None else WeightedSum.of(shared, num_train),
            client_ids=np.array([client_id], dtype=np.int64),
            rows=np.asarray(row, dtype=np.float32)[None],
            norms=np.asarray(norms, dtype=np.float32)[None],
            label_counts=None if label_counts is None else np.asarray(label_counts, dtype=np.int64)[None],
            model=np.asarray(model, dtype=np.float32),
        )

    def numerators(self) -> np.ndarray:
        """Σ_i (n_i p̃_ij) θ_i^cw as a (K, P_cw) float32 array."""
        if self.heads is not None:
            return self.heads
        assert self.model is not None
        return classwise_partial_sums(self.model[None], np.ones(1), self.masses[None])[0]

    def __add__(self, other: ClasswiseSum) -> ClasswiseSum:
        shared = None if self.shared is None or other.shared is None else self.shared + other.shared
        return ClasswiseSum(
            self.masses + other.masses,
            shared,
            np.concatenate([self.client_ids, other.client_ids]),
            np.concatenate([self.rows, other.rows]),
            np.concatenate([self.norms, other.norms]),
            _concat(self.label_counts, other.label_counts),
            heads=self.numerators() + other.numerators(),
        )

    def __iadd__(self, other: ClasswiseSum) -> ClasswiseSum:
        if self.heads is None or not self.heads.flags.writeable:  # a single upload, or read zero-copy from Ray
            return self + other
        self.heads += other.numerators()
        self.masses = self.masses + other.masses
        if self.shared is not None and other.shared is not None:
            self.shared = self.shared.__iadd__(other.shared)
        self.client_ids = np.concatenate([self.client_ids, other.client_ids])
        self.rows = np.concatenate([self.rows, other.rows])
        self.norms = np.concatenate([self.norms, other.norms])
        self.label_counts = _concat(self.label_counts, other.label_counts)
        return self

    @property
    def count(self) -> int:
        return len(self.client_ids)

    @property
    def nbytes(self) -> int:
        arrays = (self.heads, self.model, self.masses, self.client_ids, self.rows, self.norms, self.label_counts)
        return sum(int(a.nbytes) for a in arrays if a is not None) + (self.shared.nbytes if self.shared else 0)

    def is_finite(self) -> bool:
        arrays = (self.heads, self.model, self.masses, self.rows, self.norms)
        finite = all(bool(np.isfinite(a).all()) for a in arrays if a is not None)
        return finite and (self.shared is None or self.shared.is_finite())


# --- the round's broadcast: personalisation and contribution on the worker ----------------------


@dataclass(frozen=True)
class ClasswiseModels(Broadcast):
    """The K class-specific models G_j, the FedAvg part G_avg and the p̃ matrix (M × K)."""

    heads: np.ndarray
    """(K, P_cw): G_1..G_K over the class-wise part."""
    shared: np.ndarray
    """G_avg over the FedAvg part (empty in all-layer mode)."""
    initial_buffers: np.ndarray
    """Floating-point buffers of the common initialisation, for clients that have not trained yet."""
    p_tilde: np.ndarray
    """(M, K): each client's latest uploaded row (1/K before its first upload)."""
    parts: ModelParts
    params: CwFedAvgParams

    def _row(self, job: ClientJob) -> np.ndarray:
        if self.params.variant == "dist":  # "w/ Dist.": the true p_i, which the client knows itself
            return _client_distribution(job, self.params.p_source)
        return self.p_tilde[job.client_id]

    def personalise(self, job: ClientJob) -> None:
        """θ_i^cw ← Σ_j p̃_ij G_j (Eq. 7); θ_i^other ← G_avg; buffers stay the client's own."""
        flat, parts = job.flat, self.parts
        flat.load(personalise(self._row(job), self.heads), parts.classwise)
        offset = 0
        for part in parts.shared:
            size = part.stop - part.start
            flat.load(self.shared[offset : offset + size], part)
            offset += size
        if flat.buffer_layout.size:
            buffers = job.state["buffers"] if job.state and "buffers" in job.state else self.initial_buffers
            flat.buffers.copy_(torch.tensor(buffers))  # a copy: small, and may be read-only

    def contribute(self, job: ClientJob) -> ClasswiseSum:
        """p̃_i from the trained output weight (Eq. 4), then this client's share of Eq. 6 and FedAvg."""
        parts = self.parts
        theta = job.flat.numpy()
        norms = output_row_norms(theta[parts.output_weight].reshape(parts.output_shape))
        counts = None
        if self.params.variant == "dist":  # the client reveals n_ij; q_ij then uses p_i (spec §1.3)
            counts = _client_counts(job, self.params.p_source)
            row = empirical_distribution(counts)
        else:
            row = distribution_from_norms(norms)
        if job.flat.buffer_layout.size:  # BatchNorm statistics are never averaged (spec §1.3)
            job.state = {"buffers": job.flat.buffers.detach().cpu().numpy().copy()}
        shared = parts.gather_shared(theta) if parts.shared else None
        return ClasswiseSum.of_client(job.client_id, job.num_train, row, norms, theta[parts.classwise], shared, counts)

    def bytes_down(self, job: ClientJob) -> int:
        """A real client receives only its personalised model (buffers stay local)."""
        return job.flat.size * 4


# --- the two halves -----------------------------------------------------------------------------


class CwFedAvgClient(ClientHalf[CwFedAvgParams]):
    """Plain SGD on CE + c·‖p_i − p̃_i(W)‖₂, recomputed from the live output weight each mini-batch.

    The term is stated functionally (:meth:`functional_extra_loss`), so the sequential loop and
    the stacked one (:mod:`rayfed.vectorized`) share it; the per-client constant is p_i.
    """

    def __init__(self, params: CwFedAvgParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        self.coefficient = params.wdr_coefficient
        indices = {model_parts(spec, arch, params).output_index for arch in spec.layouts}
        if len(indices) != 1:
            raise ConfigError(
                f"cwFedAvg's client half needs the output weight at one position in every architecture, "
                f"but model.client_models={sorted(spec.layouts)} place it differently"
            )
        self.output_index = indices.pop()

    def loss_constants(self, job: ClientJob) -> dict[str, torch.Tensor]:
        if not self.coefficient:
            return {}
        p = _client_distribution(job, self.params.p_source)
        return {"p": torch.as_tensor(p, dtype=torch.float32, device=job.device)}

    def functional_extra_loss(
        self, params: list[torch.Tensor], constants: Mapping[str, torch.Tensor]
    ) -> torch.Tensor | None:
        if not self.coefficient:
            return None
        return wdr_penalty(constants["p"], params[self.output_index], self.coefficient)


class CwFedAvgServer(ServerHalf[CwFedAvgParams, ClasswiseSum]):
    """Keeps G_1..G_K (K × P_cw), G_avg, the M × K rows p̃ and the M × K row norms; no client models."""

    @classmethod
    def validate(cls, params: CwFedAvgParams, spec: ProblemSpec) -> None:
        model_parts(spec, require_homogeneous(spec, "cwfedavg"), params)

    def __init__(self, params: CwFedAvgParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        architecture = require_homogeneous(spec, "cwfedavg")
        self.parts = model_parts(spec, architecture, params)
        state = np.asarray(initial[architecture], dtype=np.float32)
        theta, self.initial_buffers = state[: spec.layouts[architecture].size], state[spec.layouts[architecture].size :]
        k, m = spec.num_classes, spec.num_clients
        self.heads = np.tile(theta[self.parts.classwise], (k, 1))
        self.shared = self.parts.gather_shared(theta).copy()
        self.p_tilde = np.full((m, k), 1.0 / k, dtype=np.float32)
        self.norms = np.zeros((m, k), dtype=np.float32)

    def broadcast(self) -> ClasswiseModels:
        return ClasswiseModels(self.heads, self.shared, self.initial_buffers, self.p_tilde, self.parts, self.params)

    def aggregate(self, ctx: RoundContext, contribution: ClasswiseSum | None) -> dict[str, float]:
        if contribution is None:
            return {"clients_aggregated": 0.0}
        absent = int((contribution.masses <= 0).sum())
        if absent:
            logger.warning("round %d: %d classes have no uploaded mass; their models are kept", ctx.round, absent)
        self.heads = classwise_average(contribution.numerators(), contribution.masses, self.heads)
        if contribution.shared is not None:
            self.shared = contribution.shared.average()
        # New arrays, so broadcasts already handed out (and Ray's zero-copy reads) stay valid.
        self.p_tilde = self.p_tilde.copy()
        self.p_tilde[contribution.client_ids] = contribution.rows
        self.norms = self.norms.copy()
        self.norms[contribution.client_ids] = contribution.norms
        return {
            "clients_aggregated": float(contribution.count),
            "classes_absent": float(absent),
            "p_tilde_max_mean": float(contribution.rows.max(axis=1).mean()),
        }

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"heads": self.heads, "shared": self.shared, "p_tilde": self.p_tilde, "norms": self.norms}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.heads = np.array(state["heads"], dtype=np.float32)
        self.shared = np.array(state["shared"], dtype=np.float32)
        self.p_tilde = np.array(state["p_tilde"], dtype=np.float32)
        self.norms = np.array(state["norms"], dtype=np.float32)


register_algorithm(
    "cwfedavg",
    params=CwFedAvgParams,
    server=CwFedAvgServer,
    client=CwFedAvgClient,
    summary="cwFedAvg with WDR (Lee & Choi, ICCV 2025): class-wise aggregation personalised by p-tilde",
    keeps_client_state=True,
)
