"""FedClassAvg: classifier averaging with local supervised-contrastive representation learning.

Jang, Kim, Lee and Seo, "FedClassAvg: Local Representation Learning for Personalized
Federated Learning on Heterogeneous Neural Networks", ICPP 2022, arXiv:2210.14226
("P-FCA" below; authors' code ``hukla/FedClassAvg``). See docs/algorithms.md, FedClassAvg section.

Each client k holds f_k = C_k ∘ F_k: its own extractor F_k (any architecture with a 512-d
output, :mod:`rayfed.models.fedclassavg_nets`) and a classifier C_k = ReLU → Linear(512 → K)
of the same shape in every client. Per round (P-FCA §3, Algorithm 1):

1. each sampled client replaces C_k by the global classifier C and trains on (Eq. 4)

       L = L_SupCon(F_k(x′), F_k(x″); y) + CE(C_k(F_k(x′)), y) + ρ·L_R(C_k, C)

   over two augmented views x′, x″ of each batch (:mod:`rayfed.data.augment`), with a new
   Adam(lr, betas (0.5, 0.999)) each round;
2. the server averages the classifiers only (Eq. 3): w_C ← Σ_k n_k w_Ck / Σ_k n_k, n_k = the
   client's training samples;
3. every client is evaluated with its own extractor and its own *locally trained*
   classifier; the new C is loaded only at the client's next training round.

Only C's weight and bias (K·512 + K floats, 20.5 KB for K = 10) travel each way. Each
client's whole model (extractor, its trained classifier, BatchNorm statistics) stays in
the engine's client state store between rounds. A client that never trained holds its own
random initialisation, drawn from (run seed, client id); the server's initial C is another
independent draw.

Code vs paper (``fidelity``; docs/algorithms.md, FedClassAvg section):

* SupCon as coded: unnormalised features, τ = 100, scaled by τ/τ_base (τ_base = 0.07);
* L_R: code (ρ/2)·Σ_{weight, bias} MSE(w_Ck, w_C), skipped at each epoch's first batch; paper
  ρ·‖w_Ck − w_C‖₂;
* warm-up: the code first trains every client one epoch with its own classifier (prox anchor:
  that classifier); here a client does so at its first training round, which is the same
  under full participation (see :attr:`FedClassAvgParams.warmup`).

``mode="weight"`` is the paper's "+weight" variant (§4.3, homogeneous models only): the whole
model is averaged as in FedAvg, and the proximal term still acts on the classifier only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
import torch
import torch.nn.functional as F

from rayfed.algorithms.common.architecture import sole_architecture
from rayfed.algorithms.common.global_model import GLOBAL_STATE
from rayfed.algorithms.common.own_models import (
    CLIENT_INIT_STREAM,
    ClientInit,
    has_saved_model,
    own_model_state,
    save_model_state,
)
from rayfed.algorithms.contributions import WeightedState, WeightedSum
from rayfed.algorithms.declarations import VaryingWork
from rayfed.algorithms.fedclassavg_equations import classifier_prox, supcon_loss
from rayfed.algorithms.hooks import ClientHalf, RoundContext, ServerHalf, Start
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.data.augment import SIMCLR_AUGMENT
from rayfed.models import seeded_init
from rayfed.models.fedclassavg_nets import FedClassAvgNet
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.phase import Adam, Batch, Constants, Outputs, Params, Phase, Samples
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.errors import ConfigError
from rayfed.util.seeding import init_seed
from rayfed.util.validation import check, check_choice, check_real

__all__ = [
    "FedClassAvgParams",
    "FedClassAvgMessage",
    "FedClassAvgClient",
    "FedClassAvgServer",
    "supcon_loss",
    "classifier_prox",
]

CLASSIFIER_LAYER = FedClassAvgNet.output_layer
"""The shared linear layer, ``"classifier.1"``."""

SERVER_INIT_STREAM = CLIENT_INIT_STREAM - 1
"""Initialisation stream of the server's first global classifier."""


@section("algorithm.params")
@dataclass(frozen=True)
class FedClassAvgParams:
    """Hyper-parameters (``algorithm.params.*``); defaults follow the authors' code.

    The learning rate, batch size and local epochs are ``train.lr`` / ``train.batch_size`` /
    ``train.local_epochs`` (P-FCA Tab. 1: batch 64, 1 epoch, lr 1e-4 CIFAR-10, 5e-4 EMNIST,
    6e-4 FMNIST). ``train.momentum`` and ``train.weight_decay`` are not used (Adam, no decay).
    """

    rho: float = documented(0.1, "ρ, the proximal weight (Eq. 4); Tab. 1: 0.1 (CIFAR-10, EMNIST), 0.4662 (FMNIST).")
    temperature: float = documented(100.0, "τ of SupCon's logits z_a·z_b/τ (100 in the code; not given in the paper).")
    base_temperature: float = documented(
        0.07, "τ_base: SupCon is scaled by τ/τ_base (≈ 1428.6 with the code's values)."
    )
    normalize_features: bool = documented(
        False, "L2-normalise z before SupCon (standard SupCon; the authors' code has it commented out)."
    )
    contrastive: bool = documented(
        True, 'Include L_SupCon (false: the ablation "CA + PR" of Tab. 4, CE on one augmented view).'
    )
    fidelity: Literal["code", "paper"] = documented(
        "code", "code: L_R = (ρ/2)·Σ MSE per classifier tensor; paper: L_R = ρ·‖w_Ck − w_C‖₂ (Eq. 5)."
    )
    mode: Literal["classifier", "weight"] = documented(
        "classifier", 'classifier: share C only; weight: the "+weight" variant (whole model, homogeneous only).'
    )
    warmup: bool | None = documented(
        None,
        "One epoch with the client's own classifier before its first round (code); null = true with "
        'fidelity="code" and mode="classifier", else false.',
    )
    adam_betas: tuple[float, float] = documented(
        (0.5, 0.999), "Adam's (β1, β2); the optimiser is recreated every round (its moments are reset)."
    )
    adam_eps: float = documented(1e-8, "Adam's ε.")

    def __post_init__(self) -> None:
        p = "algorithm.params."
        check_real(p + "rho", self.rho, low=0)
        for name in ("temperature", "base_temperature", "adam_eps"):
            check_real(p + name, getattr(self, name), low=0, low_open=True)
        check_choice(p + "fidelity", self.fidelity, ("code", "paper"))
        check_choice(p + "mode", self.mode, ("classifier", "weight"))
        check(
            not (self.mode == "weight" and self.warmup),
            p + "warmup",
            self.warmup,
            "false or unset with algorithm.params.mode='weight' (clients start from the global model)",
        )
        try:
            betas = tuple(float(b) for b in self.adam_betas)
        except (TypeError, ValueError):
            betas = ()
        valid = len(betas) == 2 and all(0 <= b < 1 for b in betas)
        check(valid, p + "adam_betas", self.adam_betas, "two numbers in [0, 1)")
        object.__setattr__(self, "adam_betas", betas)

    @property
    def warmup_enabled(self) -> bool:
        if self.warmup is not None:
            return self.warmup
        return self.fidelity == "code" and self.mode == "classifier"


# --- worker side ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FedClassAvgMessage:
    """The global classifier (``mode="classifier"``) or the whole global model (``"weight"``)."""

    vector: np.ndarray
    init: ClientInit


@dataclass
class ClassifierStart(Start):
    """A client's start, and its own initial classifier when a warm-up with it is due (its first round)."""

    own_classifier: np.ndarray | None = None


class FedClassAvgClient(VaryingWork, ClientHalf[FedClassAvgParams, FedClassAvgMessage]):
    """Its own model with the global classifier (or the global model, ``"weight"``); SupCon on two views + CE on
    the first + ρ·L_R on the classifier, with a fresh Adam (Eq. 4): a warm-up phase with the client's own
    classifier before its first round (the code's), then the round's phase. Keeps its model and sends n_k·w_Ck
    (or n_k·θ_k, ``"weight"``)."""

    def __init__(self, params: FedClassAvgParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        self.views = 2 if params.contrastive else 1
        for arch, layout in spec.layouts.items():
            if layout.names[-2:] != (f"{CLASSIFIER_LAYER}.weight", f"{CLASSIFIER_LAYER}.bias"):
                raise ConfigError(
                    f"algorithm.name='fedclassavg' needs models with an extractor and a classifier (fca_*), but "
                    f"model {arch!r} does not end in {CLASSIFIER_LAYER!r}"
                )

    def start(self, message: FedClassAvgMessage, job: ClientJob) -> ClassifierStart:
        """The client's own model with the global classifier (or the global model, ``"weight"``)."""
        if self.params.mode == "weight":
            return ClassifierStart(message.vector)
        part = job.flat.slice_of(CLASSIFIER_LAYER)
        own = np.array(own_model_state(job, message.init), dtype=np.float32)
        warmup = own[part].copy() if self.params.warmup_enabled and not has_saved_model(job) else None
        own[part] = message.vector
        return ClassifierStart(own, warmup)

    def phases(self, message: FedClassAvgMessage, job: ClientJob) -> list[Phase]:
        if not isinstance(job.model, FedClassAvgNet):
            raise ConfigError(
                f"algorithm.name='fedclassavg' needs models with an extractor and a classifier (fca_*), but "
                f"client {job.client_id} has {job.architecture!r}"
            )
        part = job.flat.slice_of(CLASSIFIER_LAYER)
        received = message.vector[part] if self.params.mode == "weight" else message.vector
        start: ClassifierStart = job.start
        classifiers = [received] if start.own_classifier is None else [start.own_classifier, received]
        moved = to_device([np.asarray(c, np.float32) for c in classifiers], job.device)
        epochs = [1] * (len(moved) - 1) + [job.train.local_epochs]  # the code's warm-up: one epoch
        return [self._phase(anchor, (part.start, part.stop), n) for anchor, n in zip(moved, epochs)]

    def _phase(self, anchor: torch.Tensor, part: tuple[int, int], epochs: int) -> Phase:
        """``epochs`` of Eq. 4 from the classifier ``anchor`` (loaded into the model), which L_R pulls towards."""
        return Phase(
            epochs=epochs,
            loss=self.objective,
            optimizer=Adam(self.params.adam_betas, self.params.adam_eps),
            samples=Samples(augment=SIMCLR_AUGMENT, views=self.views),
            forward=self.forward,
            constants={"anchor": anchor},
            load=(part, anchor),
        )

    def forward(self, module: torch.nn.Module, x: torch.Tensor) -> Outputs:
        """The extractor's features z of every view, and the classifier's logits of the first view."""
        model = cast(FedClassAvgNet, module)
        z = model.features(x)
        return Outputs(model.classifier(z[: x.shape[0] // self.views]), z)

    def objective(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        """L_SupCon(z′, z″; y) + ρ·L_R(C_k, C) of Eq. 4 (the CE is the loop's); L_R is 0 at the phase's first step,
        where the code skips it."""
        p = self.params
        total = params[-1].new_zeros(())
        if p.contrastive:
            assert out.features is not None
            z = F.normalize(out.features, dim=1) if p.normalize_features else out.features
            total = total + supcon_loss(z, batch.y, p.temperature, p.base_temperature, batch.weight)
        if p.rho > 0:
            weight, bias = params[-2], params[-1]
            anchor = constants["anchor"]
            prox = classifier_prox(
                weight, bias, anchor[: weight.numel()].view(weight.shape), anchor[weight.numel() :], p.rho, p.fidelity
            )
            total = total + torch.where(batch.step > 0, prox, torch.zeros_like(prox))
        return total

    def upload(self, message: FedClassAvgMessage, job: ClientJob) -> WeightedState:
        """Keep the trained model in the client's state; upload n_k·w_Ck (or n_k·θ_k, ``"weight"``)."""
        save_model_state(job)
        if self.params.mode == "weight":
            return WeightedState()
        return WeightedState((job.worker_model.slice_of(CLASSIFIER_LAYER),))

    def evaluation(self, message: FedClassAvgMessage, job: ClientJob) -> np.ndarray:
        """The client's own model with its locally trained classifier (as the authors' code evaluates)."""
        if self.params.mode == "weight" and not has_saved_model(job):
            return message.vector
        return own_model_state(job, message.init)


# --- server side ----------------------------------------------------------------------------


class FedClassAvgServer(ServerHalf[FedClassAvgParams, WeightedSum]):
    """Keeps the global classifier w_C (or, ``"weight"``, the global model); FedAvg's weighted average of the
    uploads (Eq. 3), broadcast as a :class:`FedClassAvgMessage`."""

    @classmethod
    def validate(cls, params: FedClassAvgParams, spec: ProblemSpec) -> None:
        """Images only (its augmented views are image transforms); every model must end in the shared
        ``classifier.1`` (one shape); ``"weight"`` needs one model."""
        if spec.input_kind != "image":
            raise ConfigError(
                f"algorithm.name='fedclassavg' trains on two augmented views of each image, but data.dataset gives "
                f"{spec.input_kind!r} inputs; use an image dataset, or an algorithm such as 'fedproto' or 'fedavg'"
            )
        _shared_feature_dim(spec)
        if params.mode == "weight" and not spec.homogeneous:
            raise ConfigError(
                "algorithm.params.mode='weight' averages whole models and needs one architecture, but "
                f"the clients use {sorted(spec.layouts)}; use mode='classifier' for heterogeneous clients"
            )

    def __init__(self, params: FedClassAvgParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)  # validates
        if params.mode == "weight":
            self.global_vector = np.array(initial[sole_architecture(spec)], dtype=np.float32)
        else:
            self.global_vector = initial_classifier(spec.seed, _shared_feature_dim(spec), spec.num_classes)
        self.init = ClientInit.of(spec)

    def broadcast(self) -> FedClassAvgMessage:
        return FedClassAvgMessage(self.global_vector, self.init)

    def aggregate(self, ctx: RoundContext, contribution: WeightedSum) -> dict[str, float]:
        self.global_vector = contribution.average()
        return {"clients_aggregated": float(contribution.count)}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {GLOBAL_STATE: self.global_vector}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.global_vector = np.array(state[GLOBAL_STATE], dtype=np.float32)


def initial_classifier(seed: int, feature_dim: int, num_classes: int) -> np.ndarray:
    """The server's first w_C: a fresh ``Linear(feature_dim -> K)`` (weight rows, then bias), its own seed."""
    with seeded_init(init_seed(seed, SERVER_INIT_STREAM)):
        layer = torch.nn.Linear(feature_dim, num_classes)
    return torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach()]).numpy()


def _shared_feature_dim(spec: ProblemSpec) -> int:
    """d of the K x d classifier every architecture shares; ConfigError if a model has none or another d."""
    dims = {}
    for arch, layout in spec.layouts.items():
        name = f"{CLASSIFIER_LAYER}.weight"
        if spec.output_layer.get(arch) != CLASSIFIER_LAYER or name not in layout.names:
            raise ConfigError(
                f"algorithm.name='fedclassavg' shares the classifier {CLASSIFIER_LAYER!r}, but model {arch!r} has "
                f"output layer {spec.output_layer.get(arch)!r}; use FedClassAvg's networks, e.g. "
                "model.client_models=['fca_resnet18', 'fca_shufflenet', 'fca_googlenet', 'fca_alexnet']"
            )
        dims[arch] = layout.shapes[layout.names.index(name)]
    if len(set(dims.values())) > 1:
        raise ConfigError(f"algorithm.name='fedclassavg' needs one classifier shape across models, but got {dims}")
    return int(next(iter(dims.values()))[1])


register_algorithm(
    "fedclassavg",
    params=FedClassAvgParams,
    server=FedClassAvgServer,
    client=FedClassAvgClient,
    summary="FedClassAvg (Jang et al. 2022): classifier averaging + local SupCon for heterogeneous models",
    keeps_client_state=True,
    reporting=Reporting(label=lambda params: "FedClassAvg+weight" if params.mode == "weight" else "FedClassAvg"),
)
