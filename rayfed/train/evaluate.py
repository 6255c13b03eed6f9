"""Evaluating a model on a client's test split, and reading its penultimate features."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from rayfed.train.flat import FlatModel
from rayfed.train.host import to_device
from rayfed.train.stack_layout import parameter_major
from rayfed.train.stacked_layers import model_unstackable, stacked_layers

__all__ = [
    "EvalStats",
    "eval_batch_size",
    "evaluate_model",
    "mean_cross_entropy",
    "correct_predictions",
    "features_before_output",
    "model_losses",
]


def eval_batch_size(device: torch.device) -> int:
    """Samples per forward when evaluating (no gradients are kept): 1024 on a GPU, which wants large
    batches; 128 on a CPU, where a larger batch's activations fall out of the caches and the same
    forward passes take up to 2x longer (benchmarks/README.md, "Evaluation batch on CPU")."""
    return 1024 if device.type == "cuda" else 128


@dataclass(frozen=True)
class EvalStats:
    """What one model's evaluation counted: correct predictions, summed cross-entropy and samples."""

    correct: int
    loss_sum: float
    count: int


@torch.no_grad()
def evaluate_model(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int | None = None
) -> EvalStats:
    """Correct predictions and summed cross-entropy of ``model`` on ``(x, y)``, ``batch_size`` samples
    per forward (default :func:`eval_batch_size` of their device)."""
    model.eval()
    batch_size = batch_size or eval_batch_size(x.device)
    correct = torch.zeros((), dtype=torch.long, device=x.device)
    loss_sum = torch.zeros((), device=x.device)
    for start in range(0, int(y.shape[0]), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        correct += (logits.argmax(dim=1) == target).sum()
        loss_sum += F.cross_entropy(logits, target, reduction="sum")
    return EvalStats(correct=int(correct), loss_sum=float(loss_sum), count=int(y.shape[0]))


@torch.no_grad()
def mean_cross_entropy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of ``model`` (in eval mode) on ``(x, y)``, as a 0-d tensor on their device:
    nothing is read back, so a worker can read a whole call's values at once."""
    model.eval()
    batch_size = eval_batch_size(x.device)
    loss_sum = torch.zeros((), device=x.device)
    for start in range(0, int(y.shape[0]), batch_size):
        stop = start + batch_size
        loss_sum += F.cross_entropy(model(x[start:stop]), y[start:stop], reduction="sum")
    return loss_sum / max(int(y.shape[0]), 1)


@torch.no_grad()
def correct_predictions(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """How many of ``(x, y)`` ``model`` (in eval mode) predicts right, as a 0-d tensor on their device."""
    model.eval()
    batch_size = eval_batch_size(x.device)
    correct = torch.zeros((), dtype=torch.long, device=x.device)
    for start in range(0, int(y.shape[0]), batch_size):
        stop = start + batch_size
        correct += (model(x[start:stop]).argmax(dim=1) == y[start:stop]).sum()
    return correct


@torch.no_grad()
def features_before_output(
    model: torch.nn.Module, output_layer: str, x: torch.Tensor
) -> Iterator[tuple[int, torch.Tensor]]:
    """``(start, features)`` per batch of ``x``: what ``model`` feeds its layer ``output_layer``
    (the penultimate features), read by a hook during an ordinary forward in eval mode."""
    model.eval()
    captured: list[torch.Tensor] = []
    hook = model.get_submodule(output_layer).register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    batch_size = eval_batch_size(x.device)
    try:
        for start in range(0, int(x.shape[0]), batch_size):
            model(x[start : start + batch_size])
            yield start, captured.pop()
    finally:
        hook.remove()


@torch.no_grad()
def model_losses(
    flat: FlatModel,
    architecture: str,
    states: np.ndarray | torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    sizes: Sequence[int] | None = None,
) -> torch.Tensor:
    """The mean cross-entropy (eval mode, float64, on the device) of each of K models of ``architecture`` on the
    samples (x, y), or, with ``sizes``, on each of the consecutive groups of samples of those sizes (G, K); NaN for
    an empty group. ``states`` (K, S) holds the models' parameters, then buffers. Where the architecture stacks,
    the K models run as one stack (:mod:`rayfed.train.stacked_layers`), one forward per batch of samples; else one
    model after the other in ``flat``. IFCA's clusters and FedFomo's candidates are weighed so, on the device: a
    client's choice never waits for the host."""
    grouped = sizes is not None
    sizes = list(sizes) if sizes is not None else [int(y.shape[0])]
    k, count = len(states), int(y.shape[0])
    rows = states if isinstance(states, torch.Tensor) else to_device([np.asarray(states, np.float32)], x.device)[0]
    owner, counts = to_device([np.repeat(np.arange(len(sizes)), sizes), np.asarray(sizes, np.float64)], x.device)
    sums = torch.zeros(len(sizes), k, device=x.device)
    if model_unstackable(architecture, flat.module, drop_last=True):
        for j in range(k):
            flat.load_state(rows[j])
            flat.module.eval()
            for start in range(0, count, eval_batch_size(x.device)):
                stop = start + eval_batch_size(x.device)
                losses = F.cross_entropy(flat.module(x[start:stop]), y[start:stop], reduction="none")
                sums[:, j].index_add_(0, owner[start:stop], losses)
    else:
        _stacked_losses(flat, rows, x, y, owner, sums)
    means = sums.double() / counts.clamp_min(1.0)[:, None]
    means = torch.where(counts[:, None] > 0, means, torch.full_like(means, math.nan))
    return means if grouped else means[0]


def _stacked_losses(
    flat: FlatModel, rows: torch.Tensor, x: torch.Tensor, y: torch.Tensor, owner: torch.Tensor, sums: torch.Tensor
) -> None:
    """Add each sample's cross-entropy under each of the stacked models (``rows``, K × S) to its owner's row of
    ``sums`` (G, K)."""
    k, layout, module = len(rows), flat.layout, flat.module
    module.eval()
    batch = max(eval_batch_size(x.device) // k, 1)
    with stacked_layers(module) as current:
        current["width"] = k
        current.update(zip(layout.names, layout.stacked_views(parameter_major(rows[:, : layout.size], layout), k)))
        for name, layer in module.named_modules():
            if isinstance(layer, torch.nn.BatchNorm2d):
                mean, var = (flat.buffer_layout.index(f"{name}.{stat}") for stat in ("running_mean", "running_var"))
                shift = layout.size
                current[f"{name}#running"] = (
                    rows[:, shift + mean.start : shift + mean.stop].reshape(-1),
                    rows[:, shift + var.start : shift + var.stop].reshape(-1),
                )
        for start in range(0, int(y.shape[0]), batch):
            xb, yb = x[start : start + batch], y[start : start + batch]
            logits = module(xb.repeat(1, k, *([1] * (xb.dim() - 2))))  # every model sees every sample
            losses = F.cross_entropy(logits.view(len(yb) * k, -1), yb.repeat_interleave(k), reduction="none")
            sums.index_add_(0, owner[start : start + batch], losses.view(len(yb), k))
