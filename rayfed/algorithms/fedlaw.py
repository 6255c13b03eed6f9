"""FedLAW: aggregation weights and a global shrink factor learnt on a server proxy set.

Li, Lin, Shang and Wu, "Revisiting Weighted Aggregation in Federated Learning with Neural
Networks", ICML 2023, arXiv:2302.10911. See docs/algorithms.md, FedLAW section.

Clients train as in FedAvg (plain SGD from the global model) and upload their whole models.
The server then learns, on a small class-balanced proxy set that no client owns, the
aggregation

    θ_g = γ Σ_k λ_k θ_k,    λ = softmax(z),  γ = exp(s)                                (Sec. 5)

where γ < 1 is the paper's *global weight shrinking* (Sec. 3, analogous to weight decay) and
λ the relative client weights (Sec. 4). Both are found by back-propagating the proxy set's
cross-entropy through the merged parameters (a functional forward of the model at θ_g,
:func:`proxy_loss`), with z initialised at log(n_k / Σn) and s at 0 (γ = 1: FedAvg's
aggregate is the starting point), re-initialised every round. Optimiser as the authors'
code: Adam (lr 0.01 on CIFAR-10, 0.005 otherwise; betas (0.5, 0.999)), StepLR(20, 0.5),
``server_epochs`` passes over the proxy set (100, as the FedAWA paper ran FedLAW, Sec. 5.2).

BatchNorm (``batchnorm``): ``code`` (default) does what the authors' code does
(``server_funct.fedlaw_optimization`` sets ``central_node.model.train()``, and
``load_param`` replaces only the flat parameter vector): the proxy forward runs in training
mode, so BatchNorm normalises with each proxy batch's statistics and updates the server's own
running statistics (kept across rounds), and those statistics, never the clients', are the
global model's buffers. ``mixed`` mixes the clients' buffers with λ (not shrunk) and runs the
proxy forward in evaluation mode on them. The proxy set is carved out of the pool before the
partition (:mod:`rayfed.data.held_out`) and only the server sees it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from rayfed.algorithms.common.global_model import GlobalModelServer, WholeModelsClient
from rayfed.algorithms.contributions import ClientVectors
from rayfed.algorithms.declarations import HeldOutData
from rayfed.algorithms.hooks import RoundContext
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.data.held_out import HeldOutRequest
from rayfed.data.transforms import model_inputs
from rayfed.models import build_model
from rayfed.train.flat import FlatModel
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.errors import ConfigError
from rayfed.util.seeding import init_seed
from rayfed.util.validation import check_choice, check_int, check_real

__all__ = [
    "FedLAWParams",
    "FedLAWServer",
    "merge",
    "merged_forward",
    "proxy_loss",
    "learn_aggregation",
]

_PROXY_STREAM = 1 << 30
"""Round t shuffles the proxy set with ``init_seed(seed, _PROXY_STREAM + t)``, a stream of its own."""

BETAS = (0.5, 0.999)
"""Adam betas of the server optimisation (the authors' code)."""
LR_STEP, LR_GAMMA = 20, 0.5
"""StepLR(step_size=20, gamma=0.5) over server epochs (the authors' code)."""


@section("algorithm.params")
@dataclass(frozen=True)
class FedLAWParams:
    """Hyper-parameters of FedLAW (``algorithm.params.*``)."""

    proxy_size: int = documented(
        200,
        "Class-balanced proxy samples held out for the server: 200 = 2 % of a 10,000-image test set "
        "(FedAWA paper, Sec. 5.2: 200 on CIFAR-10).",
    )
    server_lr: float = documented(
        0.005, "Adam lr of z and s: 0.01 on CIFAR-10, 0.005 on other datasets (authors' code)."
    )
    server_epochs: int = documented(100, "Passes over the proxy set per round (100 as in the FedAWA paper's runs).")
    proxy_batch_size: int = documented(
        128, "Proxy mini-batch size of the server optimisation (the authors' --validate_batchsize, 128)."
    )
    batchnorm: Literal["code", "mixed"] = documented(
        "code",
        "code: proxy forward in training mode, the server's own running statistics are the global "
        "buffers (authors' code); mixed: λ-mixed client buffers, evaluation-mode forward.",
    )

    def __post_init__(self) -> None:
        check_int("algorithm.params.proxy_size", self.proxy_size, low=1)
        check_real("algorithm.params.server_lr", self.server_lr, low=0, low_open=True)
        check_int("algorithm.params.server_epochs", self.server_epochs, low=0)
        check_int("algorithm.params.proxy_batch_size", self.proxy_batch_size, low=1)
        check_choice("algorithm.params.batchnorm", self.batchnorm, ("code", "mixed"))


# --- the equations, as pure functions -------------------------------------------------------------
def merge(thetas: torch.Tensor, logits: torch.Tensor, shrink_logit: torch.Tensor, num_params: int) -> torch.Tensor:
    """θ_g = γ Σ_k λ_k θ_k on the parameters, Σ_k λ_k b_k on the buffers; λ = softmax(z), γ = exp(s).

    ``thetas`` (M, S): the clients' states (P parameters, then buffers), ``num_params`` = P.
    """
    lam = torch.softmax(logits, dim=0)
    mixed = lam @ thetas
    gamma = torch.exp(shrink_logit)
    return torch.cat([gamma * mixed[:num_params], mixed[num_params:]])


def merged_forward(
    flat: FlatModel, state: torch.Tensor, x: torch.Tensor, server_buffers: torch.Tensor | None = None
) -> torch.Tensor:
    """The logits of ``flat``'s module at ``state`` (parameters then buffers), differentiable in ``state``:
    a functional forward (``torch.func.functional_call``) through views of the flat vector, in evaluation
    mode (BatchNorm reads the merged running statistics and never writes them). The statistics enter as
    constants: BatchNorm is not differentiable in its running statistics, so λ is learnt through the
    parameters only, as it is with any autograd implementation.

    With ``server_buffers`` (the ``code`` BatchNorm mode) the forward runs in training mode instead:
    BatchNorm normalises with the batch's statistics and updates ``server_buffers`` in place."""
    layout, buffers = flat.layout, flat.buffer_layout
    p = layout.size
    tensors = {name: layout.view(state[:p], i) for i, name in enumerate(layout.names)}
    if server_buffers is not None:
        flat.module.train()
        constants = server_buffers
    else:
        flat.module.eval()
        constants = state[p:].detach()
    tensors.update({name: buffers.view(constants, i) for i, name in enumerate(buffers.names)})
    return functional_call(flat.module, tensors, (x,))


def proxy_loss(
    flat: FlatModel,
    thetas: torch.Tensor,
    logits: torch.Tensor,
    shrink_logit: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    server_buffers: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy of the merged model on a proxy batch: the objective of z and s."""
    merged = merge(thetas, logits, shrink_logit, flat.layout.size)
    return F.cross_entropy(merged_forward(flat, merged, x, server_buffers), y)


def learn_aggregation(
    flat: FlatModel,
    thetas: torch.Tensor,
    sizes: np.ndarray,
    x: torch.Tensor,
    y: torch.Tensor,
    params: FedLAWParams,
    generator: torch.Generator,
    server_buffers: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(λ, γ, last epoch's mean proxy loss): z from log(n_k/Σn), s from 0, Adam + StepLR over
    ``params.server_epochs`` shuffled passes of the proxy set (x, y)."""
    weights = torch.as_tensor(sizes / sizes.sum(), dtype=torch.float32, device=thetas.device)
    logits = torch.log(weights.clamp_min(1e-12)).requires_grad_(True)
    shrink = torch.zeros((), device=thetas.device, requires_grad=True)
    optimiser = torch.optim.Adam([logits, shrink], lr=params.server_lr, betas=BETAS)
    scheduler = torch.optim.lr_scheduler.StepLR(optimiser, step_size=LR_STEP, gamma=LR_GAMMA)
    last = float("nan")
    for _ in range(params.server_epochs):
        order = torch.randperm(len(y), generator=generator).to(thetas.device)
        total, count = 0.0, 0
        for start in range(0, len(y), params.proxy_batch_size):
            batch = order[start : start + params.proxy_batch_size]
            optimiser.zero_grad()
            loss = proxy_loss(flat, thetas, logits, shrink, x[batch], y[batch], server_buffers)
            loss.backward()
            optimiser.step()
            total, count = total + float(loss.detach()) * len(batch), count + len(batch)
        scheduler.step()
        last = total / max(count, 1)
    with torch.no_grad():
        return torch.softmax(logits, dim=0), torch.exp(shrink), last


# --- the halves -----------------------------------------------------------------------------------
class FedLAWServer(GlobalModelServer[FedLAWParams, ClientVectors], HeldOutData):
    """Keeps θ_g; learns (λ, γ) on the proxy set every round and aggregates with them."""

    @classmethod
    def held_out(cls, params: FedLAWParams, spec: ProblemSpec) -> HeldOutRequest:
        return HeldOutRequest(params.proxy_size, balanced=True, shared=False, field="algorithm.params.proxy_size")

    def __init__(self, params: FedLAWParams, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> None:
        super().__init__(params, spec, initial)
        if spec.held_out is None:
            raise ConfigError(
                "algorithm.name='fedlaw' needs its proxy set in spec.held_out; the engine carves it out of the pool "
                "(rayfed.data.held_out); a server half built by hand needs spec=replace(spec, held_out=HeldOutSet...)"
            )
        with torch.random.fork_rng(devices=[]):  # its values are never read: every forward is functional
            self.flat = FlatModel(build_model(self.architecture, spec.input_shape, spec.num_classes))
        self.proxy_x = model_inputs(spec.held_out.inputs, spec.mean, spec.std)
        self.proxy_y = torch.from_numpy(np.asarray(spec.held_out.labels, dtype=np.int64))
        p = self.flat.layout.size
        code_bn = params.batchnorm == "code" and len(self.global_vector) > p
        self.server_buffers = torch.from_numpy(self.global_vector[p:].copy()) if code_bn else None

    def aggregate(self, ctx: RoundContext, contribution: ClientVectors) -> dict[str, float]:
        started = time.perf_counter()
        thetas = torch.from_numpy(np.ascontiguousarray(contribution.matrix(), dtype=np.float32))
        generator = torch.Generator().manual_seed(init_seed(self.spec.seed, _PROXY_STREAM + ctx.round))
        lam, gamma, loss = learn_aggregation(
            self.flat,
            thetas,
            contribution.sizes,
            self.proxy_x,
            self.proxy_y,
            self.params,
            generator,
            self.server_buffers,
        )
        with torch.no_grad():
            merged = merge(thetas, torch.log(lam.clamp_min(1e-30)), torch.log(gamma), self.flat.layout.size)
            if self.server_buffers is not None:  # the server's own running statistics, as the code's central model
                merged[self.flat.layout.size :] = self.server_buffers
        self.global_vector = merged.numpy().astype(np.float32, copy=False)
        return {
            "clients_aggregated": float(contribution.count),
            "fedlaw_gamma": float(gamma),
            "fedlaw_lambda_max": float(lam.max()),
            "fedlaw_proxy_loss": loss,
            "fedlaw_seconds": time.perf_counter() - started,
        }

    def load_extra_state(self, state: Mapping[str, np.ndarray]) -> None:
        if self.server_buffers is not None:  # the global buffers are the server's statistics
            self.server_buffers = torch.from_numpy(self.global_vector[self.flat.layout.size :].copy())


register_algorithm(
    "fedlaw",
    params=FedLAWParams,
    server=FedLAWServer,
    client=WholeModelsClient,
    summary="FedLAW (Li et al. 2023): shrink factor and softmax weights learnt by CE on a server proxy set",
    reporting=Reporting(label="FedLAW", single_model=True),
)
