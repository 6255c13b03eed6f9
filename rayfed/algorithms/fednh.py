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

import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from rayfed.algorithms.common.architecture import sole_architecture
from rayfed.algorithms.common.global_model import GlobalModel, GlobalModelServer
from rayfed.algorithms.common.own_models import CLIENT_INIT_STREAM, save_model_state, saved_model
from rayfed.algorithms.contributions import WeightedSum
from rayfed.algorithms.declarations import NormalizedFeatures
from rayfed.algorithms.fednh_equations import class_means, initial_prototypes, smooth_prototypes
from rayfed.algorithms.hooks import ClientHalf, Contribution, RoundContext, Start
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.train.evaluate import features_before_output
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.phase import SGD, Constants, Edits, Extra, Grads, Params, Phase, Trainable
from rayfed.train.problem import ProblemSpec
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


# --- what a client uploads --------------------------------------------------------------------------


@dataclass
class PrototypeSum(Contribution):
    """The body (and s) as a FedAvg :class:`WeightedSum`, plus Σ_k n_kc μ̂_kc (K × h) and Σ_k n_kc (K)."""

    body: WeightedSum
    sums: Any
    counts: Any
    sent: int = 0
    """Class means the clients sent (one per class each holds)."""

    def __add__(self, other: PrototypeSum) -> PrototypeSum:
        return PrototypeSum(
            self.body + other.body, self.sums + other.sums, self.counts + other.counts, self.sent + other.sent
        )

    @property
    def count(self) -> int:
        return self.body.count

    @property
    def nbytes(self) -> int:
        """The body sum, and per class held, its h-float mean and its count (float64)."""
        return self.body.nbytes + self.sent * (self.sums.shape[1] * 4 + 8)


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
class FedNHMessage(GlobalModel):
    """The global model: body, prototypes μ and scale s (its output layer holds s·μ, zero bias)."""

    prototypes: np.ndarray
    scale: float
    head: HeadLayout


# --- the two halves -----------------------------------------------------------------------------


class FedNHClient(ClientHalf[FedNHParams, FedNHMessage], NormalizedFeatures):
    """SGD on CE of the cosine logits, prototypes fixed; s learned too when ``learn_scale``.

    The output layer reads L2-normalised features (:class:`NormalizedFeatures`), so with weight s·μ and zero
    bias the model's forward is FedNH's classifier. s is a trainable of the phase, updated by the phase's SGD
    (the run's momentum and weight decay) from its gradient, read off the output weight's: with W = s·μ,
    ∂L/∂s = Σ_c ⟨∂L/∂W_c, μ_c⟩ (:meth:`scale_gradient`, after backward, which also zeroes the head's gradients
    and clips). Before each step and when the phase ends the output layer is s·μ with zero bias
    (:meth:`cosine_head`). A trained client keeps its model (its PM) and sends its body, s, and its class means.
    """

    def __init__(self, params: FedNHParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        architecture = sole_architecture(spec)
        layout, output = spec.layouts[architecture], spec.output_layer[architecture]
        self._weight = layout.names.index(f"{output}.weight")
        self._bias = layout.names.index(f"{output}.bias") if f"{output}.bias" in layout.names else None
        self._body: dict[torch.device, torch.Tensor] = {}

    def start(self, message: FedNHMessage, job: ClientJob) -> Start:
        return Start(message.vector)

    def phases(self, message: GlobalModel, job: ClientJob) -> list[Phase]:
        """One phase of the run's SGD on the cosine classifier, s trained where learned. Lent to another server half
        (``algorithm.client="fednh"``), the prototypes are the rows of the output weight the client started from,
        normalised, and s starts at ``scale``."""
        own = isinstance(message, FedNHMessage)
        start_scale = message.scale if isinstance(message, FedNHMessage) else self.params.scale
        arrays = [np.full((), start_scale, np.float32)]
        if isinstance(message, FedNHMessage):
            arrays.append(np.asarray(message.prototypes, np.float32))
        moved = to_device(arrays, job.device)
        scale, learned = moved[0], self.params.learn_scale
        constants = {"prototypes": moved[1]} if own else {}
        return [
            Phase(
                epochs=job.train.local_epochs,
                optimizer=SGD(),
                constants={**constants, **({} if learned else {"scale": scale})},
                extra={"s": Trainable(scale)} if learned else {},
                on_train_batch_start=self.cosine_head,
                on_after_backward=self.scale_gradient,
                on_train_end=self.cosine_head,
            )
        ]

    def _head(self, params: Params, constants: Constants) -> tuple[int, int | None, torch.Tensor]:
        """(the output weight's index, the bias's or None, μ (K, h)): the message's prototypes, or (lent to another
        server half) the rows of the starting output weight, normalised."""
        shape = params[self._weight].shape
        if "prototypes" in constants:
            return self._weight, self._bias, constants["prototypes"].view(shape)
        offset = sum(p.numel() for p in params[: self._weight])
        start = constants["start"][offset : offset + shape[0] * shape[1]]
        return self._weight, self._bias, F.normalize(start.view(shape), dim=1)

    def scale_gradient(self, params: Params, grads: Grads, constants: Constants, extra: Extra) -> Edits:
        """∂L/∂s from the output weight's gradient; the head's gradients zeroed; every gradient (and s's) clipped
        to ``max_grad_norm`` together."""
        weight, bias, mu = self._head(params, constants)
        g_weight = grads[weight]
        assert g_weight is not None
        s_grad = (g_weight * mu).sum() if self.params.learn_scale else None
        head = {weight, *([] if bias is None else [bias])}
        edited: Edits = {i: torch.zeros_like(g) if i in head else g for i, g in enumerate(grads) if g is not None}
        if self.params.max_grad_norm is not None:
            squared = functools.reduce(operator.add, [g.pow(2).sum() for g in edited.values()])
            squared = squared if s_grad is None else squared + s_grad.pow(2)
            factor = torch.clamp(self.params.max_grad_norm / (squared.sqrt() + 1e-6), max=1.0)
            edited = {i: g * factor for i, g in edited.items()}
            s_grad = None if s_grad is None else s_grad * factor
        edits = edited
        if s_grad is not None:
            edits["s"] = s_grad
        return edits

    def cosine_head(self, params: Params, constants: Constants, extra: Extra) -> Edits:
        """The output layer set to s·μ, bias 0."""
        weight, bias, mu = self._head(params, constants)
        s = extra["s"] if self.params.learn_scale else constants["scale"]
        edits: Edits = {weight: s * mu}
        if bias is not None:
            edits[bias] = torch.zeros_like(params[bias])
        return edits

    def upload(self, message: FedNHMessage, job: ClientJob) -> Contribution:
        """Keep the trained model (the client's PM); send its body and s, and its class means."""
        save_model_state(job)
        features = torch.cat([f for _, f in features_before_output(job.model, message.head.output_layer, job.x_train)])
        sums, counts = class_means(features, job.y_train, message.head.shape[0])
        scale = job.extra["s"] if self.params.learn_scale else torch.full((), message.scale, device=job.device)
        if job.device not in self._body:
            self._body[job.device] = to_device([np.flatnonzero(message.head.body)], job.device)[0]
        body = torch.cat([job.trained[self._body[job.device]], scale.reshape(1).float()])
        weight = job.num_train if self.params.body_weighting == "size" else 1.0
        held = int(np.count_nonzero(np.asarray(job.train_label_counts) > 0))
        return PrototypeSum(WeightedSum.of(body, weight), sums, counts, held)

    def evaluation(self, message: FedNHMessage, job: ClientJob) -> np.ndarray:
        """PM: the client's model after its latest local training; the global model before it trained."""
        return saved_model(job, message.vector)

    def global_model(self, message: FedNHMessage, job: ClientJob) -> np.ndarray:
        """GM: the averaged body with the smoothed prototypes."""
        return message.vector

    def bytes_down(self, message: FedNHMessage, job: ClientJob) -> int:
        """The body, the K × h prototypes and s (the output layer's bias is not sent: it is zero)."""
        return int(message.head.body.sum()) * 4 + int(message.prototypes.nbytes) + 4


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
        return FedNHMessage(self.global_vector, self.prototypes, self.scale, self.head)

    def aggregate(self, ctx: RoundContext, contribution: PrototypeSum) -> dict[str, float]:
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
    reporting=Reporting(label="FedNH"),
)
