"""FedNH: class prototypes spread uniformly on the hypersphere, then infused with class semantics.

Dai, Chen, Li, Heinecke, Sun and Xu, "Tackling Data Heterogeneity in Federated Learning with
Class Prototypes", AAAI 2023, arXiv:2212.02758 (authors' code ``Yutong-Dai/FedNH``).
See docs/algorithms.md, FedNH section.

The classifier is a matrix of K class prototypes μ_c (unit rows, K × h) and the logits are
scaled cosines, ℓ_c(x) = s·cos(f(x), μ_c), f = the body's penultimate features. Here the
model's own output layer holds them: its weight is s·μ (every row of norm s), its bias is
zero, and the layer reads L2-normalised features (the client half declares
``normalized_features``: the worker's models get a :class:`~rayfed.models.layers.NormalizedLinear`
output layer), so the model's ordinary forward *is* FedNH's classifier (training, evaluation and its
loss alike). One round:

* the server initialises the prototypes uniformly: orthonormal rows when K ≤ h (all pairwise
  cosines 0), else rows spread by minimising their largest pairwise cosines;
* a client loads the global model (body, s·μ), trains the body (and s, if learnable) on CE
  with the prototypes *fixed*, then sends its body, s, and per class c it holds the unit mean
  of its normalised embeddings, μ̂_kc = normalise(mean_{i: y_i = c} f̂(x_i)), weighted by its
  count n_kc (the sum Σ_k n_kc μ̂_kc adds across clients);
* the server averages the body (and s) as FedAvg, and smooths each prototype held by a client:

      μ_c ← normalise(ρ·μ_c + (1 − ρ)·normalise(Σ_k n_kc μ̂_kc / Σ_k n_kc))

  (a class no uploading client holds keeps μ_c).

Evaluation, as the paper reports it: the personalised model (PM) is each client's own model
after its latest local training (kept in the client state store; the global model before it
has trained), the global model (GM) is the averaged body with the new prototypes.

Code vs paper: the code averages the body uniformly over the round's clients
(``body_weighting="uniform"``); the default here is FedAvg's size weighting. The code clips the
gradient norm at 10 (``max_grad_norm``) and learns s from 1.0 (``scale``, ``learn_scale``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from rayfed.algorithms.common.architecture import sole_architecture
from rayfed.algorithms.common.global_model import GlobalModelServer
from rayfed.algorithms.common.own_models import CLIENT_INIT_STREAM, save_model_state, saved_model
from rayfed.algorithms.contributions import WeightedSum
from rayfed.algorithms.hooks import Broadcast, ClientHalf, Contribution, RoundContext
from rayfed.algorithms.registry import register_algorithm
from rayfed.train.evaluate import features_before_output
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.loop import FINAL_CARRY
from rayfed.train.phase import Carry, Constants, Edits, Params, Phase
from rayfed.train.problem import ProblemSpec
from rayfed.train.scratch import ScratchKey
from rayfed.util.documented import documented, section
from rayfed.util.errors import ConfigError
from rayfed.util.seeding import init_seed
from rayfed.util.validation import check, check_choice, check_real

__all__ = [
    "FedNHParams",
    "PrototypeSum",
    "FedNHMessage",
    "FedNHClient",
    "FedNHServer",
    "initial_prototypes",
    "class_means",
    "smooth_prototypes",
]

PROTOTYPE_STREAM = CLIENT_INIT_STREAM - 2
"""Initialisation stream of the server's first prototypes (FedClassAvg's classifier uses ``- 1``)."""

_SCRATCH = ScratchKey[tuple[np.ndarray, float]]("fednh.head")
"""``job.scratch`` key: (prototypes μ (K, h), scale s) the client received."""


@section("algorithm.params")
@dataclass(frozen=True)
class FedNHParams:
    """Hyper-parameters of FedNH (``algorithm.params.*``); defaults are the authors' code's."""

    smoothing: float = documented(0.9, "ρ of the prototype update μ ← normalise(ρμ + (1−ρ)μ̄) (--FedNH_smoothing 0.9).")
    scale: float = documented(
        1.0, "s of the cosine logits s·cos(f, μ_c), or its start when learned: 1.0 (code, CNNs; 30 when fixed)."
    )
    learn_scale: bool = documented(True, "Learn s on the clients and average it (code: FedNH_fix_scaling false).")
    body_weighting: Literal["size", "uniform"] = documented(
        "size", "size: the body averaged by n_k as FedAvg; uniform: by 1/|S_t| as the authors' code."
    )
    max_grad_norm: float | None = documented(
        10.0, "Clip the gradient norm (body and s) at this value, as the code does; null = no clipping."
    )

    def __post_init__(self) -> None:
        p = "algorithm.params."
        check_real(p + "smoothing", self.smoothing, low=0, high=1)
        check_real(p + "scale", self.scale, low=0, low_open=True)
        check(isinstance(self.learn_scale, bool), p + "learn_scale", self.learn_scale, "true or false")
        check_choice(p + "body_weighting", self.body_weighting, ("size", "uniform"))
        if self.max_grad_norm is not None:
            check_real(p + "max_grad_norm", self.max_grad_norm, low=0, low_open=True)


# --- the math: pure functions --------------------------------------------------------------------


def initial_prototypes(num_classes: int, dim: int, seed: int, steps: int = 500) -> np.ndarray:
    """K unit prototypes spread uniformly on the sphere S^{h−1}, drawn from ``seed``.

    K ≤ h: orthonormal rows (the QR of a Gaussian matrix), every pairwise cosine 0, as the
    code's orthogonal initialisation. K > h: normalised Gaussian rows moved by projected
    gradient descent on a soft maximum of their pairwise cosines.
    """
    generator = torch.Generator().manual_seed(seed)
    gaussian = torch.randn(max(num_classes, dim), min(num_classes, dim), generator=generator, dtype=torch.float64)
    if num_classes <= dim:
        q, r = torch.linalg.qr(gaussian)  # (h, K), orthonormal columns
        q = q * torch.sign(torch.diagonal(r))  # a unique (Haar-distributed) orthonormal basis
        return q.T.contiguous().float().numpy()
    points = F.normalize(gaussian, dim=1).requires_grad_(True)  # (K, h)
    optimiser = torch.optim.SGD([points], lr=0.1)
    off_diagonal = ~torch.eye(num_classes, dtype=torch.bool)
    for _ in range(steps):
        cosines = F.normalize(points, dim=1) @ F.normalize(points, dim=1).T
        loss = torch.logsumexp(10.0 * cosines[off_diagonal], dim=0)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        with torch.no_grad():
            points.copy_(F.normalize(points, dim=1))
    return points.detach().float().numpy()


def class_means(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """A client's upload for the prototypes: (Σ rows n_c·μ̂_c, counts n_c), K × h and K.

    μ̂_c = normalise(mean of the L2-normalised features of class c), as the code's
    ``_estimate_prototype``; a class the client does not hold has a zero row and count 0.
    """
    unit = F.normalize(features.double(), dim=1)
    counts = torch.bincount(labels, minlength=num_classes).double()
    sums = torch.zeros(num_classes, unit.shape[1], dtype=torch.float64, device=unit.device)
    sums.index_add_(0, labels, unit)
    means = F.normalize(sums, dim=1)  # the unit mean; a zero row stays zero
    return (means * counts[:, None]).float().cpu().numpy(), counts.cpu().numpy()


def smooth_prototypes(prototypes: np.ndarray, sums: np.ndarray, counts: np.ndarray, rho: float) -> np.ndarray:
    """The server's update: μ_c ← normalise(ρμ_c + (1−ρ)·normalise(Σ_k n_kc μ̂_kc / Σ_k n_kc)) for each
    class with Σ_k n_kc > 0; the other classes keep μ_c."""
    held = counts > 0
    updated = np.array(prototypes, dtype=np.float64)
    average = sums[held] / counts[held, None]
    average /= np.maximum(np.linalg.norm(average, axis=1, keepdims=True), 1e-12)
    mixed = rho * updated[held] + (1.0 - rho) * average
    updated[held] = mixed / np.maximum(np.linalg.norm(mixed, axis=1, keepdims=True), 1e-12)
    return updated.astype(np.float32)


# --- what a client uploads --------------------------------------------------------------------------


@dataclass
class PrototypeSum(Contribution):
    """The body (and s) as a FedAvg :class:`WeightedSum`, plus Σ_k n_kc μ̂_kc (K × h) and Σ_k n_kc (K)."""

    body: WeightedSum
    sums: np.ndarray
    counts: np.ndarray

    def __add__(self, other: PrototypeSum) -> PrototypeSum:
        return PrototypeSum(self.body + other.body, self.sums + other.sums, self.counts + other.counts)

    @property
    def count(self) -> int:
        return self.body.count

    @property
    def nbytes(self) -> int:
        """The body sum, and per class held, its h-float mean and its count (float64)."""
        held = int((self.counts > 0).sum())
        return self.body.nbytes + held * (self.sums.shape[1] * 4 + 8)

    def is_finite(self) -> bool:
        return self.body.is_finite() and bool(np.isfinite(self.sums).all()) and bool(np.isfinite(self.counts).all())


# --- the round's message -------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadLayout:
    """Where the output layer lies in the state vector, and which entries make the body."""

    output_layer: str
    weight: slice
    bias: slice | None
    shape: tuple[int, int]
    body: np.ndarray
    """Boolean mask over the state vector (parameters then buffers): True outside the output layer."""

    @classmethod
    def of(cls, spec: ProblemSpec, architecture: str, state_size: int | None = None) -> HeadLayout:
        """The head of ``architecture``; ``state_size`` = the length of its state vectors (default:
        its parameters and the buffers ``spec`` lists)."""
        layout, name = spec.layouts[architecture], spec.output_layer[architecture]
        index = layout.names.index(f"{name}.weight")
        shape = layout.shapes[index]
        if len(shape) != 2 or shape[0] != spec.num_classes:
            raise ConfigError(
                f"algorithm.name='fednh' needs an output layer with one prototype row per class, but "
                f"{name}.weight of model {architecture!r} has shape {shape} for {spec.num_classes} classes"
            )
        bias = layout.index(f"{name}.bias") if f"{name}.bias" in layout.names else None
        if state_size is None:
            buffers = spec.buffer_layouts.get(architecture)
            state_size = layout.size + (buffers.size if buffers is not None else 0)
        body = np.ones(state_size, dtype=bool)
        body[layout.index(f"{name}.weight")] = False
        if bias is not None:
            body[bias] = False
        return cls(name, layout.index(f"{name}.weight"), bias, (shape[0], shape[1]), body)


@dataclass(frozen=True)
class FedNHMessage(Broadcast):
    """The global model: body, prototypes μ and scale s (its output layer holds s·μ, zero bias)."""

    vector: np.ndarray
    prototypes: np.ndarray
    scale: float
    head: HeadLayout
    body_weighting: str

    def personalise(self, job: ClientJob) -> None:
        job.flat.load_state(self.vector)
        job.scratch[_SCRATCH] = (self.prototypes, self.scale)

    def contribute(self, job: ClientJob) -> PrototypeSum:
        """Keep the trained model (the client's PM); send its body and s, and its class means."""
        save_model_state(job)
        features = torch.cat([f for _, f in features_before_output(job.model, self.head.output_layer, job.x_train)])
        sums, counts = class_means(features, job.y_train, self.head.shape[0])
        carry = job.scratch.get(FINAL_CARRY, {}).get(0)
        scale = float(carry["s"]) if carry else self.scale
        state = job.flat.state_numpy()
        body = np.append(state[self.head.body], np.float32(scale))
        weight = job.num_train if self.body_weighting == "size" else 1.0
        return PrototypeSum(WeightedSum.of(body, weight), sums, counts)

    def prepare_eval(self, job: ClientJob) -> None:
        """PM: the client's model after its latest local training; the global model before it trained."""
        job.flat.load_state(saved_model(job, self.vector))

    def prepare_global_eval(self, job: ClientJob) -> bool:
        """GM: the averaged body with the smoothed prototypes."""
        job.flat.load_state(self.vector)
        return True

    def bytes_down(self, job: ClientJob) -> int:
        """The body, the K × h prototypes and s (the output layer's bias is not sent: it is zero)."""
        return int(self.head.body.sum()) * 4 + int(self.prototypes.nbytes) + 4


# --- the two halves -----------------------------------------------------------------------------


class FedNHClient(ClientHalf[FedNHParams]):
    """SGD on CE of the cosine logits, prototypes fixed; s learned too when ``learn_scale``.

    The output layer reads L2-normalised features (``normalized_features``), so with weight s·μ and zero
    bias the model's forward is FedNH's classifier. The gradient of s is read off the output weight's: with
    W = s·μ, ∂L/∂s = Σ_c ⟨∂L/∂W_c, μ_c⟩ (:meth:`scale_gradient`, after backward); after each step the output
    layer is set back to s·μ with zero bias (:meth:`cosine_head`), so weight decay and momentum act on the
    body and on s only. s and its momentum are the phase's carry.
    """

    normalized_features = True

    def phases(self, job: ClientJob) -> list[Phase]:
        prototypes, scale = job.scratch.get(_SCRATCH, (None, self.params.scale))
        train = job.train
        numbers = [np.float32(job.lr), np.float32(train.momentum), np.float32(train.weight_decay), np.float32(scale)]
        arrays = numbers + ([np.asarray(prototypes, np.float32)] if prototypes is not None else [])
        moved = to_device([np.asarray(a) for a in arrays], job.device)
        constants = {"lr": moved[0], "momentum": moved[1], "weight_decay": moved[2]}
        if prototypes is not None:
            constants["prototypes"] = moved[4]
        s, zero = moved[3], torch.zeros_like(moved[3])
        return [
            Phase(
                epochs=train.local_epochs,
                constants=constants,
                needs_start=prototypes is None,
                carry={"s": s, "s_buffer": zero, "s_grad": zero},
                on_after_backward=self.scale_gradient,
                on_after_optimizer_step=self.cosine_head,
            )
        ]

    def __init__(self, params: FedNHParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        architecture = sole_architecture(spec)
        layout, output = spec.layouts[architecture], spec.output_layer[architecture]
        self._weight = layout.names.index(f"{output}.weight")
        self._bias = layout.names.index(f"{output}.bias") if f"{output}.bias" in layout.names else None

    def _head(self, params: Params, constants: Constants) -> tuple[int, int | None, torch.Tensor]:
        """(the output weight's index, the bias's or None, μ (K, h)): the broadcast's prototypes, or (trained
        without FedNH's message) the rows of the starting output weight, normalised."""
        shape = params[self._weight].shape
        if "prototypes" in constants:
            return self._weight, self._bias, constants["prototypes"].view(shape)
        offset = sum(p.numel() for p in params[: self._weight])
        start = constants["start"][offset : offset + shape[0] * shape[1]]
        return self._weight, self._bias, F.normalize(start.view(shape), dim=1)

    def scale_gradient(self, params: Params, grads: Params, constants: Constants, carry: Carry) -> tuple[Edits, Carry]:
        """∂L/∂s from the output weight's gradient; the head's gradients zeroed; every gradient (and s's) clipped
        to ``max_grad_norm`` together."""
        weight, bias, mu = self._head(params, constants)
        s_grad = (grads[weight] * mu).sum() if self.params.learn_scale else torch.zeros_like(carry["s"])
        head = {weight, *([] if bias is None else [bias])}
        edited = [torch.zeros_like(g) if i in head else g for i, g in enumerate(grads)]
        if self.params.max_grad_norm is not None:
            squared = sum(g.pow(2).sum() for g in edited) + s_grad.pow(2)
            factor = torch.clamp(self.params.max_grad_norm / (squared.sqrt() + 1e-6), max=1.0)
            edited = [g * factor for g in edited]
            s_grad = s_grad * factor
        return dict(enumerate(edited)), {**carry, "s_grad": s_grad}

    def cosine_head(self, params: Params, constants: Constants, carry: Carry) -> tuple[Edits, Carry]:
        """s by SGD (with the run's momentum and weight decay), then the output layer set to s·μ, bias 0."""
        weight, bias, mu = self._head(params, constants)
        s, buffer = carry["s"], carry["s_buffer"]
        if self.params.learn_scale:
            g = carry["s_grad"] + constants["weight_decay"] * s
            buffer = torch.where(constants["momentum"] > 0, buffer * constants["momentum"] + g, g)
            s = s - constants["lr"] * buffer
        edits = {weight: s * mu}
        if bias is not None:
            edits[bias] = torch.zeros_like(params[bias])
        return edits, {**carry, "s": s, "s_buffer": buffer}


class FedNHServer(GlobalModelServer[FedNHParams, PrototypeSum]):
    """Keeps the global state vector (output layer = s·μ, zero bias), the prototypes μ and s."""

    @classmethod
    def validate(cls, params: FedNHParams, spec: ProblemSpec) -> None:
        """One architecture (the body is averaged) whose output layer has one row per class."""
        super().validate(params, spec)
        HeadLayout.of(spec, sole_architecture(spec))

    def __init__(self, params: FedNHParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)  # validates
        self.head = HeadLayout.of(spec, self.architecture, len(self.global_vector))
        k, h = self.head.shape
        self.prototypes = initial_prototypes(k, h, init_seed(spec.seed, PROTOTYPE_STREAM))
        self.scale = float(params.scale)
        self._write_head()

    def _write_head(self) -> None:
        """The output layer of the global state: weight s·μ, bias 0 (a new array: broadcasts stay valid)."""
        vector = self.global_vector.copy()
        vector[self.head.weight] = (self.scale * self.prototypes).reshape(-1)
        if self.head.bias is not None:
            vector[self.head.bias] = 0.0
        self.global_vector = vector

    def broadcast(self) -> FedNHMessage:
        return FedNHMessage(self.global_vector, self.prototypes, self.scale, self.head, self.params.body_weighting)

    def aggregate(self, ctx: RoundContext, contribution: PrototypeSum | None) -> dict[str, float]:
        if contribution is None:
            return {"clients_aggregated": 0.0}
        average = contribution.body.average()
        vector = self.global_vector.copy()
        vector[self.head.body] = average[:-1]
        self.global_vector = vector
        if self.params.learn_scale:
            self.scale = float(average[-1])
        before = self.prototypes
        self.prototypes = smooth_prototypes(before, contribution.sums, contribution.counts, self.params.smoothing)
        self._write_head()
        cosines = (before * self.prototypes).sum(axis=1)
        return {
            "clients_aggregated": float(contribution.count),
            "classes_updated": float((contribution.counts > 0).sum()),
            "prototype_shift": float(np.mean(1.0 - cosines)),
            "scale": self.scale,
        }

    def extra_state(self) -> dict[str, np.ndarray]:
        return {"prototypes": self.prototypes, "scale": np.array([self.scale])}

    def load_extra_state(self, state: Mapping[str, np.ndarray]) -> None:
        self.prototypes = np.array(state["prototypes"], dtype=np.float32)
        self.scale = float(np.asarray(state["scale"]).reshape(-1)[0])


register_algorithm(
    "fednh",
    params=FedNHParams,
    server=FedNHServer,
    client=FedNHClient,
    summary="FedNH (Dai et al., AAAI 2023): fixed uniform prototypes as cosine classifier, smoothed with class means",
    keeps_client_state=True,
    label="FedNH",
)
