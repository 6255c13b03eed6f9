"""KT-pFL: personalised knowledge transfer through a learnt knowledge-coefficient matrix.

Zhang, Guo, Ma, Wang, Xu and Wu, "Parameterized Knowledge Transfer for Personalized Federated
Learning", NeurIPS 2021, arXiv:2111.02862. See docs/algorithms.md, KT-pFL section; the
equations are in :mod:`rayfed.algorithms.ktpfl_equations`.

Every client keeps its own model (any architecture: the clients exchange predictions, not
weights) in the client state store. A round, for a sampled client n:

1. distil towards its personalised soft target t_n = Σ_m c_nm s_m on the public set (Eq. 6),
   when the server has one (from the second round on);
2. train on its own data with cross-entropy (Eq. 5; ``train.*``);
3. upload its soft predictions s_n = softmax(f(w_n; x_pub)/T) on the public set.

The server stores the latest s_m of every client, takes ``coef_steps`` gradient steps on the
knowledge-coefficient matrix c (Eq. 7-8), and broadcasts the new targets. The public set is
carved out of the pool before the partition, or drawn from another dataset
(``public_dataset``), and seen by the server and every client (:mod:`rayfed.data.held_out`).
Evaluated: each client's own model.

**+weight** (``share_weights=True``, homogeneous models; FedClassAvg paper, Table 3): the
clients also upload their weights, and a client starts the round from its personalised model
Σ_m c_nm w_m instead of distilling on the public set (the weights carry the knowledge); c is
still learnt from the soft predictions.

``fidelity`` chooses among the code behind the FedClassAvg paper's KT-pFL numbers as written
(``code``: hukla/FedClassAvg ``src/KTpFL.py``), its rules on one consistent public set (``corrected``,
the default) and our reading of the KT-pFL paper (``paper``); the rules are in
:mod:`rayfed.algorithms.ktpfl_equations`. As written, the code draws a new public set every round to
compute the targets (``collaborative_training``, ``load_public_dataset``) but distils on the set drawn
at the start, pairing each image with the target of an unrelated one, and feeds the distilled images as
raw 0–255 values (its ``data`` class) and the predicted ones as ToTensor's [0, 1];
``code`` reproduces the pairing by permuting the targets' rows with a new seeded permutation every
round (one for all clients, as one draw is), and both input scales. ``max_local_epochs`` grows the local epochs by one a
round, as that code does ("KT-pFL requires 20 epochs of local updates").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from rayfed.algorithms.common.architecture import require_homogeneous
from rayfed.algorithms.common.own_models import ClientInit, own_model_state, save_model_state
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.declarations import HeldOutData, VaryingWork
from rayfed.algorithms.hooks import ClientHalf, Contribution, RoundContext, ServerHalf, Start
from rayfed.algorithms.ktpfl_equations import (
    code_distillation_loss,
    distillation_loss,
    mixing_weights,
    personalised_targets,
    soft_predictions,
    update_coefficients,
)
from rayfed.algorithms.private_uploads import UploadBeyondModel
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.data.held_out import HeldOutRequest
from rayfed.data.transforms import model_inputs
from rayfed.train.evaluate import eval_batch_size
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.phase import SGD, Batch, Constants, Outputs, Params, Phase, Samples
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.errors import ConfigError
from rayfed.util.seeding import init_seed
from rayfed.util.validation import check_choice, check_int, check_real

__all__ = ["KTpFLParams", "KTpFLMessage", "KTpFLClient", "KTpFLServer", "code_pairing", "local_epochs"]

FIDELITIES = ("corrected", "code", "paper")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
"""The normalisation the authors' code gives its 3-channel public set (CIFAR-100) to predict on."""
PAIRING_STREAM = 1 << 23
"""Stream of ``fidelity="code"``'s per-round permutation of the targets: ``init_seed(seed, PAIRING_STREAM + round)``."""


@section("algorithm.params")
@dataclass(frozen=True)
class KTpFLParams:
    """Hyper-parameters of KT-pFL (``algorithm.params.*``)."""

    public_size: int = documented(
        3000, "Public samples seen by server and clients (~3,000 in the FedClassAvg paper, Table 5)."
    )
    public_balanced: bool = documented(False, "Draw the public set class-balanced instead of uniformly.")
    public_dataset: str = documented(
        "",
        "Where the public set comes from: '' holds it out of the clients' pool; a dataset name (e.g. 'mnist', "
        "'cifar100') draws it from that dataset under data.root, as the FedClassAvg paper's runs do (MNIST for "
        "Fashion-MNIST and EMNIST, six CIFAR-100 classes for CIFAR-10).",
    )
    public_classes: tuple[int, ...] = documented(
        (), "The classes of public_dataset to draw from, e.g. [0, 2, 20, 63, 71, 82]; empty: all."
    )
    temperature: float = documented(10.0, "Softmax temperature T of the soft predictions and of the distillation.")
    coef_lr: float = documented(
        0.01, "η of the knowledge-coefficient update: 0.01 MNIST-family, 0.02 CIFAR (FedClassAvg's runs)."
    )
    penalty: float = documented(
        0.6,
        "ρ of the penalty on c - 1/M (code: ρ·mean_m (c_nm - 1/M)² per row; paper: "
        "(ρ/2)||c - 1/M||²): 0.6 MNIST-family, 0.7 CIFAR.",
    )
    coef_steps: int = documented(1, "Gradient steps on c per round.")
    distill_epochs: int = documented(1, "Passes over the public set per round distilling towards the target.")
    share_weights: bool = documented(
        False, "'+weight' variant (homogeneous models): start each round from Σ_m c_nm w_m instead of distilling."
    )
    fidelity: Literal["corrected", "code", "paper"] = documented(
        "corrected",
        "corrected: the rules of hukla/FedClassAvg KTpFL.py (behind P-FCA's numbers) on one normalised public set: "
        "c-loss MSE + ρ·mean penalty, no clipping or renormalising, distillation MSE(softmax(z), t); code: that file "
        "as written: each distilled image gets the target of another (rows permuted every round), distilled images "
        "as raw 0-255 values, predicted ones as ToTensor's [0, 1] (ImageNet-normalised with 3 channels); paper: "
        "KL c-loss, T²·KL distillation.",
    )
    distill_batch_size: int = documented(256, "Batch of the distillation pass (256 in both authors' codes).")
    max_local_epochs: int = documented(
        0,
        "Local epochs grow by one a round up to this (20 in hukla/FedClassAvg, 'KT-pFL requires 20 epochs'); "
        "0: train.local_epochs every round.",
    )

    def __post_init__(self) -> None:
        check_choice("algorithm.params.fidelity", self.fidelity, FIDELITIES)
        check_int("algorithm.params.distill_batch_size", self.distill_batch_size, low=1)
        check_int("algorithm.params.max_local_epochs", self.max_local_epochs, low=0)
        check_int("algorithm.params.public_size", self.public_size, low=1)
        for label in self.public_classes:
            check_int("algorithm.params.public_classes", label, low=0)
        if self.public_classes and not self.public_dataset:
            raise ConfigError(
                "algorithm.params.public_classes needs algorithm.params.public_dataset (the dataset "
                "whose classes they are); the pool's public set is drawn from all its classes"
            )
        check_real("algorithm.params.temperature", self.temperature, low=0, low_open=True)
        check_real("algorithm.params.coef_lr", self.coef_lr, low=0)
        check_real("algorithm.params.penalty", self.penalty, low=0)
        check_int("algorithm.params.coef_steps", self.coef_steps, low=0)
        check_int("algorithm.params.distill_epochs", self.distill_epochs, low=0)

    def label(self) -> str:
        return "KT-pFL +weight" if self.share_weights else "KT-pFL"

    @property
    def rule(self) -> str:
        """The coefficient and target rules of :mod:`~rayfed.algorithms.ktpfl_equations`: the code's, or the paper's."""
        return "paper" if self.fidelity == "paper" else "code"


@dataclass(frozen=True)
class KTpFLMessage:
    """The round's personalised targets (M, P, K), or, with +weight, the mixing and the clients' models."""

    init: ClientInit
    targets: np.ndarray | None
    """t_n for every client n; None before any client uploaded (or with +weight)."""
    mixing: np.ndarray | None = None
    """+weight: c̃ (M, M_seen), rows over the clients whose models the server holds."""
    models: np.ndarray | None = None
    """+weight: those clients' models (M_seen, S)."""


def code_pairing(num_public: int, seed: int, round_index: int) -> np.ndarray:
    """``fidelity="code"``: which target row each public image distils towards in round ``round_index``, one
    permutation for every client of the round. The authors' code computes the targets on a public set drawn anew
    each round and distils the images of the set drawn at the start towards them row by row, so an image's target
    is that of an unrelated image; a fresh permutation of the one set pairs them the same way."""
    return np.random.default_rng(init_seed(seed, PAIRING_STREAM + round_index)).permutation(num_public)


class KTpFLClient(VaryingWork, ClientHalf[KTpFLParams, KTpFLMessage]):
    """Its own model (or, +weight, Σ_m c̃_nm w_m); distils towards its target on the public set, trains on local
    data, keeps its model and uploads its predictions on the public set (and, +weight, the model)."""

    def __init__(self, params: KTpFLParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        if spec.held_out is None:
            raise ConfigError(
                "algorithm.name='ktpfl' needs the public set in spec.held_out (the engine carves it "
                "out of the pool, rayfed.data.held_out)"
            )
        self._public = spec.held_out
        self._inputs: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def public_inputs(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(distilled on, predicted on), made once per device: the public set normalised as the clients' data, both
        times; as the authors' code has it (``fidelity="code"``), raw 0-255 values, then ToTensor's [0, 1]
        (ImageNet-normalised with 3 channels)."""
        if device not in self._inputs:
            if self.params.fidelity != "code":
                x = model_inputs(self._public.inputs, self.spec.mean, self.spec.std, device=device)
                self._inputs[device] = (x, x)
            else:
                raw = to_device([np.asarray(self._public.inputs)], device)[0].float()
                channels = raw.shape[1]
                mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.0,) * channels, (1.0,) * channels)
                self._inputs[device] = (raw, model_inputs(self._public.inputs, mean, std, device=device))
        return self._inputs[device]

    def start(self, message: KTpFLMessage, job: ClientJob) -> Start:
        """Its own model, or (+weight) Σ_m c̃_nm w_m."""
        if message.mixing is not None and message.models is not None:
            return Start((message.mixing[job.client_id] @ message.models).astype(np.float32))
        return Start(own_model_state(job, message.init))

    def phases(self, message: KTpFLMessage, job: ClientJob) -> list[Phase]:
        """The distillation on the public set (from the second round on, without +weight), then local training
        (its epochs growing by one a round up to ``max_local_epochs``, when set)."""
        phases = []
        if message.targets is not None and not self.params.share_weights:
            target = message.targets[job.client_id]
            if self.params.fidelity == "code":  # each image distils towards the target of another (another draw)
                target = target[code_pairing(len(target), self.spec.seed, job.round)]
            x_distil, _ = self.public_inputs(job.device)
            code = self.params.rule == "code"
            targets = to_device([np.asarray(target, np.float32)], job.device)[0]
            phases.append(
                Phase(
                    epochs=self.params.distill_epochs,
                    loss=self.distillation,
                    cross_entropy=False,
                    optimizer=SGD(momentum=0.0, weight_decay=0.0),
                    samples=Samples((x_distil, targets), self.params.distill_batch_size, drop_last=code),
                    reports=False,
                )
            )
        return [*phases, Phase(epochs=local_epochs(self.params, job.round, job.train.local_epochs))]

    def distillation(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        """``code`` and ``corrected``: MSE(softmax(z), t), as the authors' code; ``paper``: T²·KL(t ‖ softmax(z/T))
        (Eq. 6)."""
        if self.params.rule == "code":
            return code_distillation_loss(out.logits, batch.y, batch.weight)
        return distillation_loss(out.logits, batch.y, self.params.temperature, batch.weight)

    def upload(self, message: KTpFLMessage, job: ClientJob) -> Contribution:
        """Keep the trained model; upload its predictions on the public set (and, +weight, the model)."""
        save_model_state(job)
        predictions = self.predict(job, self.public_inputs(job.device)[1]).float().reshape(-1)
        row = torch.cat([predictions, job.trained]) if self.params.share_weights else predictions
        return ClientVectors.of(row, job.client_id, job.num_train)

    @torch.no_grad()
    def predict(self, job: ClientJob, x_public: torch.Tensor) -> torch.Tensor:
        """s_n = softmax(f(w_n; x)/T) on the public set, in evaluation mode (P, K)."""
        job.model.eval()
        batch = eval_batch_size(x_public.device)
        chunks = [job.model(x_public[i : i + batch]) for i in range(0, len(x_public), batch)]
        return soft_predictions(torch.cat(chunks), self.params.temperature)

    def evaluation(self, message: KTpFLMessage, job: ClientJob) -> np.ndarray:
        return own_model_state(job, message.init)

    def bytes_down(self, message: KTpFLMessage, job: ClientJob) -> int:
        """The client's own target (P x K floats), or its personalised model with +weight."""
        if message.mixing is not None and message.models is not None:
            return int(message.models.shape[1]) * 4
        return 0 if message.targets is None else int(message.targets[job.client_id].nbytes)


class KTpFLServer(UploadBeyondModel, ServerHalf[KTpFLParams, ClientVectors], HeldOutData):
    """Holds c (M x M), every client's latest predictions and, with +weight, their models."""

    beyond_model = "their soft labels on the public set, not a model"

    @classmethod
    def validate(cls, params: KTpFLParams, spec: ProblemSpec) -> None:
        if params.share_weights:
            require_homogeneous(spec)

    @classmethod
    def held_out(cls, params: KTpFLParams, spec: ProblemSpec) -> HeldOutRequest:
        return HeldOutRequest(
            params.public_size,
            balanced=params.public_balanced,
            shared=True,
            field="algorithm.params.public_size",
            dataset=params.public_dataset,
            classes=tuple(params.public_classes),
            source_field="algorithm.params.public_dataset",
        )

    def __init__(self, params: KTpFLParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        if spec.held_out is None:
            raise ConfigError("algorithm.name='ktpfl' needs the public set in spec.held_out (rayfed.data.held_out)")
        m, p, k = spec.num_clients, len(spec.held_out), spec.num_classes
        self.init = ClientInit.of(spec)
        self.coefficients = np.full((m, m), 1.0 / m)
        self.predictions = np.zeros((m, p, k), dtype=np.float32)
        self.seen = np.zeros(m, dtype=bool)
        self.common = np.array(next(iter(initial.values())), dtype=np.float32)
        """+weight: the common initial model, every client's start before the server holds any model."""
        size = self.common.size
        self.models = np.zeros((m, size), dtype=np.float32) if params.share_weights else np.zeros((0, 0), np.float32)

    def _targets(self) -> np.ndarray | None:
        if not self.seen.any():
            return None
        c, preds, seen = (torch.as_tensor(a) for a in (self.coefficients, self.predictions, self.seen))
        return personalised_targets(c.float(), preds, seen, normalise=self.params.rule != "code").numpy()

    def broadcast(self) -> KTpFLMessage:
        if not self.params.share_weights:
            return KTpFLMessage(self.init, self._targets())
        if not self.seen.any():  # everyone starts from the common initialisation, as FedAvg's clients do
            first = np.ones((self.spec.num_clients, 1), dtype=np.float32)
            return KTpFLMessage(self.init, None, first, self.common[None, :])
        # A mix of models, always with rows renormalised over the clients seen: the +weight variant has no published
        # code, and an unnormalised row would scale the whole model under partial participation.
        mixing = mixing_weights(torch.as_tensor(self.coefficients), torch.as_tensor(self.seen)).numpy()
        return KTpFLMessage(self.init, None, mixing.astype(np.float32), self.models[self.seen])

    def aggregate(self, ctx: RoundContext, contribution: ClientVectors) -> dict[str, float]:
        rows, ids = contribution.matrix(), contribution.client_ids
        width = self.predictions[0].size
        self.predictions[ids] = rows[:, :width].reshape(len(ids), *self.predictions.shape[1:])
        if self.params.share_weights:
            self.models[ids] = rows[:, width:]
        self.seen[ids] = True
        self.coefficients, loss = update_coefficients(
            self.coefficients,
            self.predictions,
            self.seen,
            lr=self.params.coef_lr,
            penalty=self.params.penalty,
            steps=self.params.coef_steps,
            rule=self.params.rule,
        )
        return {
            "clients_aggregated": float(contribution.count),
            "ktpfl_coef_loss": loss,
            "ktpfl_coef_diagonal": float(np.diag(self.coefficients).mean()),
        }

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            "coefficients": self.coefficients,
            "predictions": self.predictions,
            "seen": self.seen,
            "models": self.models,
        }

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.coefficients = np.array(state["coefficients"], dtype=np.float64)
        self.predictions = np.array(state["predictions"], dtype=np.float32)
        self.seen = np.array(state["seen"], dtype=bool)
        self.models = np.array(state["models"], dtype=np.float32)


def local_epochs(params: KTpFLParams, round_index: int, default: int) -> int:
    """The local epochs of round ``round_index``: with ``max_local_epochs``, the codes' ramp (round 0 is their
    1-epoch init, round t >= 1 trains min(t, max_local_epochs)); without, ``default`` (``train.local_epochs``)."""
    if not params.max_local_epochs:
        return default
    return min(max(round_index, 1), params.max_local_epochs)


register_algorithm(
    "ktpfl",
    params=KTpFLParams,
    server=KTpFLServer,
    client=KTpFLClient,
    summary="KT-pFL (Zhang et al. 2021): soft predictions on a public set mixed by a learnt coefficient matrix",
    keeps_client_state=True,
    reporting=Reporting(label=lambda params: params.label(), epochs_by_round=local_epochs),
)
