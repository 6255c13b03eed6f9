"""Stacked client training: C clients of one architecture trained as one model C times as wide.

The clients' parameters form a (C, P) stack. A stacked step runs the architecture's own
``forward`` on B "samples" that each hold one sample of every client: activations are
(B, C·channels, ...), client c's channels at c·channels, so a client is a group of channels.
Every layer that holds parameters is driven by its stacked form:

* a convolution becomes one grouped convolution (C groups of the layer's own groups);
* a linear layer one batched matrix product over the C clients;
* a BatchNorm layer one batch norm over the C·channels channels, so each client's statistics are
  taken over its own B samples, and its running statistics are its own (a stacked buffer).

Every other layer (ReLU, pooling, flattening, residual additions) acts on each channel, or on a
sample's features in order, and runs as it is. So a stacked step issues about as many operations
as one client's step, whatever C.

Clients take different numbers of steps (their data sizes differ). They are ordered by their
step count, longest first, and at step s only the clients that still have a step train: a prefix
of the stack, so no step is spent on a client that has finished. Each client draws its batches
as the sequential loop does (:func:`~rayfed.train.sgd.step_batches`); a short last batch
(``train.drop_last=False``) is padded with samples of weight 0. The result equals the sequential
path within float tolerance (tests/engine/test_vectorized.py).

What cannot be stacked trains sequentially (:func:`can_stack`): dropout (each client draws its
own masks from its own seed), layers without a stacked form, BatchNorm with short batches (the
padding would enter the batch statistics), and client halves with a loop of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob
from rayfed.train.layout import ParamLayout
from rayfed.train.sgd import epoch_orders, epoch_steps, unit

__all__ = ["can_stack", "resolve_vectorize", "StackedTraining"]

_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def resolve_vectorize(setting: str, device: torch.device) -> bool:
    """``engine.vectorize``: ``on``/``off``, or ``auto`` = stack on CUDA, sequential on CPU.

    On a GPU one client's step is latency-bound (a few kernels on a small batch), so a step of C
    clients costs little more than one; on a CPU the arithmetic is the bound and stacking gains
    nothing (benchmarks/README.md, "Stacked against sequential training").
    """
    if setting == "auto":
        return device.type == "cuda"
    return setting == "on"


def can_stack(flat: FlatModel, client_half: Any, train: Any) -> bool:
    """Whether clients of this model can train stacked: every layer holding parameters or floating-point
    buffers has a stacked form (a zero-padded ``Conv2d``, a ``Linear``, a ``BatchNorm2d`` that tracks
    running statistics with a momentum, and with ``train.drop_last`` when there is one), no dropout
    is active, and the client half trains with the default loop and states its extra loss functionally."""
    batch_norm = False
    for layer in flat.module.modules():
        if isinstance(layer, _DROPOUT) and layer.p > 0:
            return False
        holds = any(True for _ in layer.parameters(recurse=False)) or any(
            b.is_floating_point() for b in layer.buffers(recurse=False))
        zero_padded_conv = isinstance(layer, nn.Conv2d) and layer.padding_mode == "zeros"
        if not holds or isinstance(layer, nn.Linear) or zero_padded_conv:
            continue
        if isinstance(layer, nn.BatchNorm2d) and layer.track_running_stats and layer.momentum is not None:
            batch_norm = True
            continue
        return False
    if batch_norm and not train.drop_last:
        return False
    return bool(getattr(client_half, "supports_stacking", lambda: False)())


class StackedTraining:
    """Stacked steps on a worker's model of one architecture (:meth:`train`)."""

    def __init__(self, flat: FlatModel) -> None:
        self.flat = flat
        self.names = flat.layout.names
        self.layers = [(name, layer) for name, layer in flat.module.named_modules()
                       if isinstance(layer, (nn.Conv2d, nn.Linear, nn.BatchNorm2d))]

    def train(
        self,
        jobs: Sequence[ClientJob],
        starts: torch.Tensor,
        client_half: Any,
        constants: Sequence[Mapping[str, torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Train ``jobs`` (clients of this architecture) together from their starting points.

        ``starts`` (C, S) holds the clients' personalised states (parameters, then floating-point
        buffers), ``constants[c]`` client c's ``client_half.loss_constants``. Returns their trained
        states (C, S) and mean losses (C,), both on the device, and their step counts, in the order
        of ``jobs``.
        """
        device, train, count, layout = starts.device, jobs[0].train, len(jobs), self.flat.layout
        plan = _StackPlan.of(jobs, [epoch_orders(job) for job in jobs], device)
        rank = torch.tensor(plan.order, device=device)
        ordered = starts[rank]
        trained = ordered.clone()  # rows of finished clients are written as they finish
        stack = _parameter_major(ordered[:, : layout.size], layout)
        momentum = torch.zeros_like(stack) if train.momentum else None
        ordered_constants = _stack_constants([constants[c] for c in plan.order])
        extra = bool(getattr(client_half, "has_extra_loss", lambda: False)())
        stats_running = self._running_stacks(trained[:, layout.size :])
        x = torch.cat([jobs[c].x_train for c in plan.order])
        y = torch.cat([jobs[c].y_train for c in plan.order])
        loss_sums = torch.zeros(count, device=device)
        one, width = unit(device), count
        self.flat.module.train()
        with self._stacked_layers() as current:
            for s, active in enumerate(plan.active):
                if active < width:  # clients active..width-1 took their last step: keep them, train the rest
                    trained[active:width, : layout.size] = _client_major(stack, layout, width)[active:]
                    stack = _first(stack, layout, width, active)
                    momentum = None if momentum is None else _first(momentum, layout, width, active)
                    width = active
                params = stack.detach().requires_grad_(True)
                current["width"] = width
                current.update(zip(self.names, layout.stacked_views(params, width)))
                for name, (mean, var) in stats_running.items():
                    current[f"{name}#running"] = (mean[:width].view(-1), var[:width].view(-1))
                per_client = self._client_losses(plan, s, width, x, y)
                loss = per_client.sum()
                if extra:
                    views = [current[name] for name in self.names]
                    loss = loss + _extra_loss(client_half, views, ordered_constants, width)
                loss.backward(one)
                with torch.no_grad():
                    _sgd_update(stack, params.grad, jobs[0].lr, train.momentum, train.weight_decay, momentum)
                    loss_sums[:width] += per_client.detach()
        trained[:width, : layout.size] = _client_major(stack, layout, width)
        self._write_running(trained[:, layout.size :], stats_running)
        back = plan.back.to(device)
        means = loss_sums[back] / plan.step_counts(device)
        return trained[back], means, plan.steps

    # --- layers ------------------------------------------------------------------------------
    @contextmanager
    def _stacked_layers(self) -> Iterator[dict[str, Any]]:
        """Drive the model's parameterised layers by their stacked forms while the block runs; the
        mapping yielded holds the current step's stacked parameters and statistics."""
        current: dict[str, Any] = {}
        for name, layer in self.layers:
            layer.forward = _stacked_forward(name, layer, current)  # type: ignore[method-assign]
        try:
            yield current
        finally:
            for _, layer in self.layers:
                del layer.forward

    def _running_stacks(self, running: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Each BatchNorm layer's running mean and variance for every client, (C, channels) and contiguous,
        so the first clients' statistics are one contiguous block."""
        layout, out = self.flat.buffer_layout, {}
        for name, layer in self.layers:
            if isinstance(layer, nn.BatchNorm2d):
                out[name] = tuple(running[:, layout.index(f"{name}.{stat}")].contiguous()
                                  for stat in ("running_mean", "running_var"))
        return out  # type: ignore[return-value]

    def _write_running(self, running: torch.Tensor, stacks: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        layout = self.flat.buffer_layout
        for name, (mean, var) in stacks.items():
            running[:, layout.index(f"{name}.running_mean")] = mean
            running[:, layout.index(f"{name}.running_var")] = var

    def _client_losses(self, plan: _StackPlan, s: int, width: int, x: torch.Tensor, y: torch.Tensor
                       ) -> torch.Tensor:
        """Each of the first ``width`` clients' mean cross-entropy on its batch of step ``s`` (padding weighs 0)."""
        rows = plan.index[s, :, :width].reshape(-1)  # (batch, width): a sample of every client, then the next
        inputs = x.index_select(0, rows)
        logits = self.flat.module(inputs.view(plan.batch, width * inputs.shape[1], *inputs.shape[2:]))
        losses = F.cross_entropy(logits.view(plan.batch * width, -1), y.index_select(0, rows), reduction="none")
        losses = losses.view(plan.batch, width)
        if plan.weight is None:
            return losses.mean(dim=0)
        weight = plan.weight[s, :, :width]
        return (losses * weight).sum(dim=0) / weight.sum(dim=0).clamp_min(1.0)


@dataclass(frozen=True)
class _StackPlan:
    """Which samples every client of a stack trains on at every step, the clients ordered longest first."""

    order: list[int]
    """The jobs' positions, by their step counts, longest first: the clients still training are a prefix."""
    back: torch.Tensor
    """For each job, its row in the stack."""
    steps: list[int]
    """Each job's step count."""
    active: list[int]
    """At every stacked step, how many clients (a prefix of the stack) take a step."""
    index: torch.Tensor
    """(steps, batch, clients) sample indices into the clients' data laid end to end, in stack order."""
    weight: torch.Tensor | None
    """(steps, batch, clients) 1 for a sample, 0 for padding; None when every batch is full."""
    batch: int

    @classmethod
    def of(cls, jobs: Sequence[ClientJob], orders: Sequence[list[torch.Tensor]], device: torch.device) -> _StackPlan:
        """The plan of ``jobs`` from their epoch permutations, built on the host, moved in one transfer."""
        train = jobs[0].train
        batch = train.batch_size
        host = torch.cat([order for client in orders for order in client]).numpy()  # every permutation, read once
        per_epoch, steps, cursor = [], [], 0
        for job, client_orders in zip(jobs, orders):
            full, short = epoch_steps(train, job.num_train)
            epochs = []
            for _ in client_orders:
                epochs.append((host[cursor : cursor + full], host[cursor + full : cursor + full + short]))
                cursor += job.num_train
            per_epoch.append(epochs)
            steps.append(len(client_orders) * (full // batch + (1 if short else 0)))
        order = sorted(range(len(jobs)), key=lambda c: -steps[c])
        longest = steps[order[0]] if order else 0
        index = np.zeros((longest, batch, len(jobs)), dtype=np.int64)
        weight = np.zeros((longest, batch, len(jobs)), dtype=np.float32)
        offset = 0
        sizes = {c: jobs[c].num_train for c in order}
        for column, c in enumerate(order):
            s = 0
            for full, short in per_epoch[c]:
                rows = len(full) // batch
                index[s : s + rows, :, column] = full.reshape(rows, batch) + offset
                weight[s : s + rows, :, column] = 1.0
                s += rows
                if len(short):
                    index[s, : len(short), column] = short + offset
                    weight[s, : len(short), column] = 1.0
                    s += 1
            offset += sizes[c]
        padded = any(len(short) for epochs in per_epoch for _, short in epochs)
        back = np.empty(len(jobs), dtype=np.int64)
        back[order] = np.arange(len(jobs))
        active = [sum(1 for c in order if steps[c] > s) for s in range(longest)]
        return cls(order, torch.from_numpy(back), steps, active, torch.from_numpy(index).to(device),
                   torch.from_numpy(weight).to(device) if padded else None, batch)

    def step_counts(self, device: torch.device) -> torch.Tensor:
        """Each job's step count (at least 1, to divide by), on ``device``."""
        return torch.tensor([max(n, 1) for n in self.steps], dtype=torch.float32, device=device)


def _stacked_forward(name: str, layer: nn.Module, current: Mapping[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The stacked form of one layer, on activations whose dimension 1 holds the clients' channels (or
    features) one client after the other; it reads its stacked parameters from ``current`` at every call."""
    if isinstance(layer, nn.Conv2d):
        def conv(x: torch.Tensor) -> torch.Tensor:
            weight, bias = current[f"{name}.weight"], current.get(f"{name}.bias")
            return F.conv2d(x, weight.flatten(0, 1), None if bias is None else bias.flatten(),
                            layer.stride, layer.padding, layer.dilation, layer.groups * current["width"])
        return conv
    if isinstance(layer, nn.Linear):
        def linear(x: torch.Tensor) -> torch.Tensor:
            width, weight, bias = current["width"], current[f"{name}.weight"], current.get(f"{name}.bias")
            if x.dim() != 2:
                raise ValueError(f"stacked training needs 2-D inputs to linear layers, but {name} got {tuple(x.shape)}")
            rows = x.view(x.shape[0], width, -1).transpose(0, 1)  # (width, batch, in)
            out = torch.bmm(rows, weight.transpose(1, 2)) if bias is None else torch.baddbmm(
                bias.unsqueeze(1), rows, weight.transpose(1, 2))
            return out.transpose(0, 1).reshape(x.shape[0], -1)
        return linear
    assert isinstance(layer, nn.BatchNorm2d)

    def batch_norm(x: torch.Tensor) -> torch.Tensor:
        weight, bias = current.get(f"{name}.weight"), current.get(f"{name}.bias")
        mean, var = current[f"{name}#running"]
        return F.batch_norm(x, mean, var, None if weight is None else weight.flatten(),
                            None if bias is None else bias.flatten(), True, layer.momentum, layer.eps)
    return batch_norm


def _stack_constants(per_client: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    if not per_client or not per_client[0]:
        return {}
    return {key: torch.stack([c[key] for c in per_client]) for key in per_client[0]}


def _parameter_major(stack: torch.Tensor, layout: ParamLayout) -> torch.Tensor:
    """The (C, P) client-major ``stack`` of flat vectors as one parameter-major vector
    (:meth:`ParamLayout.stacked_views`)."""
    out = stack.new_empty(stack.numel())
    for target, values in zip(layout.stacked_views(out, len(stack)), layout.views(stack)):
        target.copy_(values)
    return out


def _client_major(stack: torch.Tensor, layout: ParamLayout, width: int) -> torch.Tensor:
    """The inverse of :func:`_parameter_major` for ``width`` models: their (width, P) flat vectors."""
    out = stack.new_empty(width, layout.size)
    for target, values in zip(layout.views(out), layout.stacked_views(stack, width)):
        target.copy_(values)
    return out


def _first(stack: torch.Tensor, layout: ParamLayout, width: int, keep: int) -> torch.Tensor:
    """The parameter-major stack of the first ``keep`` of its ``width`` models."""
    return torch.cat([view[:keep].reshape(-1) for view in layout.stacked_views(stack, width)])


def _extra_loss(client_half: Any, params: list[torch.Tensor], constants: Mapping[str, torch.Tensor], width: int
                ) -> torch.Tensor:
    """The client half's term (``functional_extra_loss``, 0 where it adds none), summed over the first
    ``width`` clients."""
    def term(own: list[torch.Tensor], consts: Mapping[str, torch.Tensor]) -> torch.Tensor:
        value = client_half.functional_extra_loss(own, consts)
        return own[0].new_zeros(()) if value is None else value

    mapped = torch.func.vmap(term, in_dims=(0, 0 if constants else None))
    return mapped(params, {k: v[:width] for k, v in constants.items()}).sum()


def _sgd_update(
    params: torch.Tensor, grad: torch.Tensor, lr: float, momentum: float, weight_decay: float,
    buffer: torch.Tensor | None,
) -> None:
    """One SGD step on each row of ``params`` (``rayfed.train.sgd.sgd_step`` on a stack)."""
    if weight_decay:
        grad = grad.add(params, alpha=weight_decay)
    if buffer is not None:
        buffer.mul_(momentum).add_(grad)
        grad = buffer
    params.add_(grad, alpha=-lr)
