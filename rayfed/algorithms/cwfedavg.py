"""cwFedAvg with WDR: class-wise federated averaging, personalised by estimated class distributions.

Lee & Choi, "Class-Wise Federated Averaging for Efficient Personalization", ICCV 2025
("P-ICCV" below); earlier version "Regularizing and Aggregating Clients with Class
Distribution for Personalized Federated Learning", arXiv:2406.07800 ("P-arXiv").
Reference code: github.com/regulationLee/cwFedAvg (``serveravgCW.py``, ``clientavgCW.py``).
See docs/algorithms.md, cwFedAvg section.

One round, as the engine runs it (P-ICCV Algorithm 1)::

    worker:  θ_i^cw ← Σ_j p̃_ij G_j,  θ_i^other ← G_avg                   Eq. 7
             train θ_i on CE + c·‖p_i − p̃_i(W_i)‖₂ at every mini-batch      Eq. 8
             p̃_ij = ‖W_i[j,:]‖₂ / Σ_k ‖W_i[k,:]‖₂   (output-layer weight)   Eq. 4
             send Σ_i n_i p̃_ij θ_i^cw, Σ_i n_i p̃_ij, the FedAvg sums of θ_i^other, the rows p̃_i
    server:  G_j ← Σ_i n_i p̃_ij θ_i^cw / Σ_i n_i p̃_ij                    Eq. 6
             G_avg ← Σ_i n_i θ_i^other / Σ_i n_i                            (FedAvg)
             store the rows p̃_i, broadcast (G, G_avg, p̃) for the next round

The equations are pure functions in :mod:`rayfed.algorithms.cwfedavg_equations`; the
hyper-parameters and the split into class-wise and FedAvg parts in
:mod:`rayfed.algorithms.cwfedavg_params`. This module holds the upload, the broadcast
and the two halves.

Differences from the authors' code, all deliberate:

* partial participation (join ratio < 1) works: sums run over the uploaded clients
  only, and a client that did not train keeps its stale row p̃_i (the code crashes);
* a class whose denominator Σ_i n_i p̃_ij is zero keeps its previous G_j instead of
  becoming NaN (only possible with ``variant="dist"``);
* floating-point buffers (BatchNorm statistics) are never averaged, as in the code,
  and stay with their client (kept in the client state store).

Where the paper and the code differ, ``fidelity`` (WDR coefficient 0.5·λ in the code,
λ in the paper) and ``p_source`` (p_i over the pre-split partition in the code) choose.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rayfed.algorithms.common.architecture import require_homogeneous, sole_architecture
from rayfed.algorithms.contributions import WeightedSum, as_float32, join
from rayfed.algorithms.cwfedavg_equations import (
    classwise_average,
    empirical_distribution,
    personalise,
    wdr_penalty,
)
from rayfed.algorithms.cwfedavg_figures import cwfedavg_figures
from rayfed.algorithms.cwfedavg_params import CwFedAvgParams, ModelParts, model_parts
from rayfed.algorithms.cwfedavg_private import CWFEDAVG_PARTS, client_parts, private_step
from rayfed.algorithms.declarations import SharedBody, SharedBodyEvaluation
from rayfed.algorithms.hooks import ClientHalf, Contribution, RoundContext, ServerHalf, Start
from rayfed.algorithms.private_uploads import PartwiseClient, PartwiseUpload, PrivateParts
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.algorithms.sizing import StateSizes, buffer_bytes
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.phase import Batch, Constants, Outputs, Params, Phase
from rayfed.train.problem import ProblemSpec
from rayfed.util.errors import ConfigError

if TYPE_CHECKING:
    from rayfed.train.settings import TrainConfig

logger = logging.getLogger(__name__)

__all__ = ["ClasswiseSum", "ClasswiseModels", "CwFedAvgClient", "CwFedAvgServer"]


# --- a client's own label distribution p_i (never uploaded, except by variant="dist") ------------


def _client_counts(job: ClientJob, p_source: str) -> np.ndarray:
    return np.asarray(job.label_counts if p_source == "partition" else job.train_label_counts)


def _client_distribution(job: ClientJob, p_source: str) -> np.ndarray:
    return empirical_distribution(_client_counts(job, p_source))


# --- what a worker uploads ----------------------------------------------------------------------


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
    formed when uploads are merged. On a worker its arrays are tensors on the device, summed there.
    """

    masses: Any
    shared: WeightedSum | None
    client_ids: np.ndarray
    rows: Any
    norms: Any
    label_counts: np.ndarray | None = None
    heads: Any = None
    """Σ_i (n_i p̃_ij) θ_i^cw, (K, P_cw); None while this is a single client's upload."""
    model: Any = None
    """θ_i^cw of a single client's upload; None once merged."""

    def numerators(self) -> Any:
        """Σ_i (n_i p̃_ij) θ_i^cw as a (K, P_cw) float32 array (Eq. 6's numerators)."""
        if self.heads is not None:
            return self.heads
        assert self.model is not None
        return as_float32(self.masses)[:, None] * self.model[None, :]

    def __add__(self, other: ClasswiseSum) -> ClasswiseSum:
        shared = None if self.shared is None or other.shared is None else self.shared + other.shared
        return ClasswiseSum(
            self.masses + other.masses,
            shared,
            np.concatenate([self.client_ids, other.client_ids]),
            join(self.rows, other.rows),
            join(self.norms, other.norms),
            join(self.label_counts, other.label_counts),
            heads=self.numerators() + other.numerators(),
        )

    @property
    def count(self) -> int:
        return len(self.client_ids)


# --- the round's message and the client half ------------------------------------------------------


@dataclass(frozen=True)
class ClasswiseModels:
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


class CwFedAvgClient(ClientHalf[CwFedAvgParams, ClasswiseModels], SharedBodyEvaluation, PartwiseClient):
    """Starts from Σ_j p̃_ij G_j (Eq. 7); plain SGD on CE + c·‖p_i − p̃_i(W)‖₂ (Eq. 8), recomputed from the live
    output weight each mini-batch (the per-client constant is p_i); sends p̃_i (Eq. 4) and its share of Eq. 6
    and FedAvg."""

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
        self._broadcast: tuple[Any, Any, Any] | None = None
        """(the message, its G and G_avg on the device) of the last private upload: moved once per call."""

    def _row(self, message: ClasswiseModels, job: ClientJob) -> np.ndarray:
        if self.params.variant == "dist":  # "w/ Dist.": the true p_i, which the client knows itself
            return _client_distribution(job, self.params.p_source)
        if job.state and "row" in job.state:  # with privacy the row stays with its client (cwfedavg_private)
            return np.asarray(job.state["row"])
        return message.p_tilde[job.client_id]

    def _state(self, message: ClasswiseModels, job: ClientJob, row: np.ndarray, buffers: np.ndarray) -> np.ndarray:
        """θ^cw ← Σ_j row_j G_j (Eq. 7), θ^other ← G_avg, then the floating-point ``buffers``."""
        parts, size = message.parts, job.flat.size
        state = np.empty(job.flat.state_size, dtype=np.float32)
        state[parts.classwise] = personalise(row, message.heads)
        offset = 0
        for part in parts.shared:
            width = part.stop - part.start
            state[part] = message.shared[offset : offset + width]
            offset += width
        state[size:] = buffers
        return state

    def start(self, message: ClasswiseModels, job: ClientJob) -> Start:
        """θ_i^cw ← Σ_j p̃_ij G_j (Eq. 7); θ_i^other ← G_avg; buffers stay the client's own (the initial ones before
        it has trained)."""
        own = job.state["buffers"] if job.state and "buffers" in job.state else message.initial_buffers
        return Start(self._state(message, job, self._row(message, job), np.asarray(own)))

    def phases(self, message: ClasswiseModels, job: ClientJob) -> list[Phase]:
        if not self.coefficient:
            return super().phases(message, job)
        p = to_device([_client_distribution(job, self.params.p_source).astype(np.float32)], job.device)[0]
        return [Phase(epochs=job.train.local_epochs, loss=self.wdr, constants={"p": p})]

    def wdr(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        """c·‖p_i − p̃_i(W)‖₂ of the live output weight W (Eq. 8)."""
        return wdr_penalty(constants["p"], params[self.output_index], self.coefficient)

    def upload(self, message: ClasswiseModels, job: ClientJob) -> Contribution:
        """p̃_i from the trained output weight (Eq. 4), then this client's share of Eq. 6 and FedAvg."""
        parts, size = message.parts, job.worker_model.size
        trained = job.trained
        theta = trained[:size]
        norms = torch.linalg.vector_norm(theta[parts.output_weight].view(parts.output_shape).double(), dim=-1)
        counts = None
        if self.params.variant == "dist":  # the client reveals n_ij; q_ij then uses p_i (P-arXiv Tab. 1)
            counts = _client_counts(job, self.params.p_source)
            row = to_device([empirical_distribution(counts)], job.device)[0]
        else:
            total = norms.sum()
            row = torch.where(total > 0, norms / total, torch.full_like(norms, 1.0 / len(norms)))
        if job.worker_model.buffer_layout.size:  # BatchNorm statistics are never averaged, as in the authors' code
            job.state = {"buffers": trained[size:].clone()}
        shared = torch.cat([theta[s] for s in parts.shared]) if parts.shared else None
        return ClasswiseSum(
            masses=job.num_train * row,
            shared=None if shared is None else WeightedSum.of(shared, job.num_train),
            client_ids=np.array([job.client_id], dtype=np.int64),
            rows=row.float()[None],
            norms=norms.float()[None],
            label_counts=None if counts is None else np.asarray(counts, dtype=np.int64)[None],
            model=theta[parts.classwise].clone(),
        )

    def private_parts(self, message: ClasswiseModels, job: ClientJob, upload: Any) -> tuple[Any, ...]:
        """(u_i, p̃_i) with privacy on (:mod:`rayfed.algorithms.cwfedavg_private`), from its upload's row; the row
        kept in the client's state for its next start instead of uploaded."""
        assert isinstance(upload, ClasswiseSum)
        parts = message.parts
        if self._broadcast is None or self._broadcast[0] is not message:
            heads, shared_global = to_device([message.heads, message.shared], job.device)
            self._broadcast = (message, heads, shared_global)
        _, heads, shared_global = self._broadcast
        theta = job.trained[: job.worker_model.size]
        row = upload.rows[0]  # p̃_i of its upload (Eq. 4), which is not sent
        job.state = {**(job.state or {}), "row": row}
        shared = torch.cat([theta[s] for s in parts.shared]) if parts.shared else theta[:0]
        return client_parts(row, theta[parts.classwise], shared, heads, shared_global)

    def bytes_down(self, message: ClasswiseModels, job: ClientJob) -> int:
        """One model's parameters (4·P bytes): the model it starts from (Eq. 7), which the server can form from
        its row p̃_i; the K heads it is mixed from are not counted."""
        return job.worker_model.size * 4

    def global_model(self, message: ClasswiseModels, job: ClientJob) -> np.ndarray:
        """The global model: Eq. 7 with the clients' overall class distribution p_j = Σ_i n_ij / Σ_ij n_ij
        (``job`` holds every client's counts, summed) in place of a client's row, G_avg elsewhere and the
        initial buffers. It costs no training, and shows what personalisation adds over one model."""
        return self._state(message, job, _client_distribution(job, self.params.p_source), message.initial_buffers)

    def shared_body(self, message: ClasswiseModels, jobs: Sequence[ClientJob]) -> SharedBody | None:
        """When only the output layer is class-wise (cwFedAvg (Output)) and the model has no
        client-local buffers, every personalised model is G_avg outside the output layer, and
        client i's output layer is Σ_j p̃_ij G_j restricted to it (Eq. 7): one body for all."""
        parts, flat = message.parts, jobs[0].flat
        k, h = parts.output_shape
        head_size = parts.classwise.stop - parts.classwise.start
        if parts.classwise.start != parts.output_weight.start or head_size != k * h + k or flat.buffer_layout.size:
            return None
        state = np.zeros(flat.size, dtype=np.float32)
        offset = 0
        for part in parts.shared:
            size = part.stop - part.start
            state[part] = message.shared[offset : offset + size]
            offset += size
        heads = personalise(np.stack([self._row(message, job) for job in jobs]), message.heads)
        return SharedBody(state, heads[:, : k * h].reshape(len(jobs), k, h), heads[:, k * h :])


class CwFedAvgServer(StateSizes, PartwiseUpload, ServerHalf[CwFedAvgParams, ClasswiseSum]):
    """Keeps G_1..G_K (K × P_cw), G_avg, the M × K rows p̃ and the M × K row norms; no client models. With privacy
    its clients upload :data:`~rayfed.algorithms.cwfedavg_private.CWFEDAVG_PARTS`."""

    upload_parts = CWFEDAVG_PARTS

    @classmethod
    def validate(cls, params: CwFedAvgParams, spec: ProblemSpec) -> None:
        """One architecture, whose blocks and output layer fit ``classwise_blocks`` / ``classwise_layers``."""
        model_parts(spec, require_homogeneous(spec), params)

    @classmethod
    def client_state_bytes(cls, params: CwFedAvgParams, spec: ProblemSpec, train: TrainConfig) -> int:
        """A client keeps its BatchNorm buffers only (0 bytes for cnn4): its model is formed from the class
        models each round (Eq. 7)."""
        return buffer_bytes(spec)

    @classmethod
    def server_state_bytes(cls, params: CwFedAvgParams, spec: ProblemSpec) -> int:
        """G_1..G_K and G_avg with the sums they are aggregated from, the M × K tables p̃ and norms,
        the initial buffers: no client model, and no whole global model."""
        architecture = sole_architecture(spec)
        parts = model_parts(spec, architecture, params)
        classwise = parts.classwise.stop - parts.classwise.start
        k, m = spec.num_classes, spec.num_clients
        buffers = spec.buffer_layouts[architecture].size if architecture in spec.buffer_layouts else 0
        return 4 * (2 * (k * classwise + parts.shared_size) + 2 * m * k + buffers)

    def __init__(self, params: CwFedAvgParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)  # validates
        architecture = sole_architecture(spec)
        self.parts = model_parts(spec, architecture, params)
        state = np.asarray(initial[architecture], dtype=np.float32)
        theta, self.initial_buffers = state[: spec.layouts[architecture].size], state[spec.layouts[architecture].size :]
        k, m = spec.num_classes, spec.num_clients
        self.heads = np.tile(theta[self.parts.classwise], (k, 1))
        self.shared = self.parts.gather_shared(theta).copy()
        self.p_tilde = np.full((m, k), 1.0 / k, dtype=np.float32)
        self.norms = np.zeros((m, k), dtype=np.float32)

    def part_sizes(self) -> tuple[int, ...]:
        """The model update (G_avg's and the K heads' numbers) and the K class masses (:data:`CWFEDAVG_PARTS`)."""
        return self.shared.size + self.heads.size, self.heads.shape[0]

    def broadcast(self) -> ClasswiseModels:
        return ClasswiseModels(self.heads, self.shared, self.initial_buffers, self.p_tilde, self.parts)

    def aggregate(self, ctx: RoundContext, contribution: ClasswiseSum | PrivateParts) -> dict[str, float]:
        if isinstance(contribution, PrivateParts):  # privacy on: the noised sums of the parts
            self.heads, self.shared, metrics = private_step(self.heads, self.shared, contribution)
            return metrics
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
    reporting=Reporting(
        label=CwFedAvgParams.label,
        label_note=(
            "cwFedAvg (X): X names the class-wise layers, aggregated per class (Eq. 6); the others are averaged as in "
            "FedAvg (Output: the output layer alone; FC+Output, ...: the last blocks; a+b: the layers named). w/o WDR: "
            "without the weight distribution regulariser; w/ Dist.: the clients' true class distributions, sent to the "
            "server, in place of those read off the output layer, and no regulariser."
        ),
        figures=cwfedavg_figures,
    ),
)
