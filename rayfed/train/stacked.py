"""Stacked client training: C clients of one architecture trained as one model C times as wide.

The clients' parameters form a stack. A stacked step runs the architecture's own ``forward`` on B
"samples" that each hold one sample of every client: activations are (B, C·channels, ...), client
c's channels at c·channels, so a client is a group of channels. Every layer that holds parameters
is driven by its stacked form (:mod:`rayfed.train.stacked_layers`):

* a convolution becomes one grouped convolution (C groups of the layer's own groups);
* a linear layer one batched matrix product over the C clients;
* a BatchNorm layer one batch norm over the C·channels channels, so each client's statistics are
  taken over its own B samples, and its running statistics are its own (a stacked buffer).

Every other layer (ReLU, pooling, flattening, residual additions) acts on each channel, or on a
sample's features in order, and runs as it is. So a stacked step issues about as many operations
as one client's step, whatever C.

Clients take different numbers of steps (their data sizes differ). They are ordered by their step
count, longest first, and at step s only the clients that still have a step train: a prefix of the
stack, so no step is spent on a client that has finished (:class:`~rayfed.train.stack_plan.StackPlan`).
Each client draws its batches as the sequential loop does; a short last batch
(``train.drop_last=False``) is padded with samples of weight 0. The result equals the sequential
path within float tolerance (tests/engine/test_vectorized.py).

A step of ``width`` clients reads and writes only its workspace (:class:`Workspace`), so on a GPU it
is captured once per width as a CUDA graph and replayed (:mod:`rayfed.train.graphs`); workspaces
stay allocated from call to call while they fit :data:`WORKSPACE_FRACTION` of the GPU's free memory.
What cannot be stacked trains sequentially (:func:`~rayfed.train.stacked_layers.can_stack`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rayfed.train.flat import FlatModel
from rayfed.train.graphs import StepGraphs
from rayfed.train.job import ClientJob
from rayfed.train.sgd import epoch_orders, unit
from rayfed.train.stack_plan import StackPlan, client_major, first_models, parameter_major
from rayfed.train.stacked_layers import can_stack, stacked_layers

__all__ = ["can_stack", "resolve_vectorize", "StackedTraining", "Workspace", "WORKSPACE_FRACTION"]

WORKSPACE_FRACTION = 0.1
"""Workspaces stay allocated between calls (so their captured steps can be replayed) while they take at
most this share of the GPU's free memory; beyond it a call allocates its own and runs eagerly."""


def resolve_vectorize(setting: str, device: torch.device) -> bool:
    """``engine.vectorize``: ``on``/``off``, or ``auto`` = stack on CUDA, sequential on CPU.

    On a GPU one client's step is latency-bound (a few kernels on a small batch), so a step of C
    clients costs little more than one; on a CPU the arithmetic is the bound and stacking gains
    nothing (benchmarks/README.md, "Stacked against sequential training").
    """
    if setting == "auto":
        return device.type == "cuda"
    return setting == "on"


@dataclass
class Workspace:
    """Everything one stacked step of ``width`` clients reads and writes; its storage never moves."""

    width: int
    stack: torch.Tensor
    """The clients' parameters, parameter-major (:func:`~rayfed.train.stack_plan.parameter_major`)."""
    momentum: torch.Tensor | None
    running: dict[str, tuple[torch.Tensor, torch.Tensor]]
    """Each BatchNorm layer's running mean and variance of every client, (width, channels)."""
    constants: dict[str, torch.Tensor]
    """The client half's loss constants, stacked (width, ...)."""
    loss_sums: torch.Tensor
    inputs: torch.Tensor
    """(batch·width, *sample): the step's batch, a sample of every client, then the next."""
    labels: torch.Tensor
    weight: torch.Tensor | None
    """(batch, width): 1 for a sample, 0 for padding; None when every batch is full."""
    lr: torch.Tensor

    def mutable(self) -> list[torch.Tensor]:
        """The tensors a step changes."""
        stats = [t for pair in self.running.values() for t in pair]
        return [self.stack, self.loss_sums, *stats, *([] if self.momentum is None else [self.momentum])]


class StackedTraining:
    """Stacked steps on a worker's model of one architecture (:meth:`train`)."""

    def __init__(self, flat: FlatModel, graphs: StepGraphs | None = None) -> None:
        self.flat = flat
        self.graphs = graphs or StepGraphs(flat.vector.device, enabled=False)
        self.batch_norms = [name for name, layer in flat.module.named_modules() if isinstance(layer, nn.BatchNorm2d)]
        self._kept: dict[Hashable, Workspace] = {}
        self._kept_bytes = 0

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
        device, count = starts.device, len(jobs)
        plan = StackPlan.of(jobs, [epoch_orders(job) for job in jobs], device)
        ordered = starts[torch.tensor(plan.order, device=device)]
        trained = ordered.clone()  # the rows of finished clients are written as they finish
        losses = torch.zeros(count, device=device)
        x = torch.cat([jobs[c].x_train for c in plan.order])
        y = torch.cat([jobs[c].y_train for c in plan.order])
        stacked = _stack_constants([constants[c] for c in plan.order])
        extra = bool(getattr(client_half, "has_extra_loss", lambda: False)())
        space: Workspace | None = None
        self.flat.module.train()
        with stacked_layers(self.flat.module) as current:
            for s, width in enumerate(plan.active):
                if space is None or width < space.width:
                    space = self._enter(space, width, plan, x, trained, losses, ordered, stacked, jobs[0])
                rows = plan.index[s, :, :width].reshape(-1)
                torch.index_select(x, 0, rows, out=space.inputs)
                torch.index_select(y, 0, rows, out=space.labels)
                if space.weight is not None and plan.weight is not None:
                    space.weight.copy_(plan.weight[s, :, :width])
                step = self._step(space, current, client_half if extra else None, plan.batch, jobs[0])
                self.graphs.run(self._key(space, extra), step, space.mutable())
        if space is not None:
            self._leave(space, 0, trained, losses)
        back = plan.back.to(device)
        means = losses[back] / plan.step_counts(device)
        return trained[back], means, plan.steps

    # --- workspaces ------------------------------------------------------------------------------
    def _enter(self, previous: Workspace | None, width: int, plan: StackPlan, x: torch.Tensor, trained: torch.Tensor,
               losses: torch.Tensor, ordered: torch.Tensor, constants: dict[str, torch.Tensor], job: ClientJob
               ) -> Workspace:
        """The workspace of the first ``width`` clients, filled from ``previous`` (the clients from ``width`` on
        finished: their rows are kept) or, at the first step, from the starting states."""
        layout, size = self.flat.layout, self.flat.layout.size
        space = self._workspace(width, plan, x, ordered.shape[1] - size, constants, job)
        with torch.no_grad():
            if previous is None:
                space.stack.copy_(parameter_major(ordered[:width, :size], layout))
                if space.momentum is not None:
                    space.momentum.zero_()
                space.loss_sums.zero_()
                for name, (mean, var) in space.running.items():
                    mean.copy_(ordered[:width, self._buffer(name, "running_mean")])
                    var.copy_(ordered[:width, self._buffer(name, "running_var")])
                for key, value in constants.items():
                    space.constants[key].copy_(value[:width])
            else:
                self._leave(previous, width, trained, losses)
                space.stack.copy_(first_models(previous.stack, layout, previous.width, width))
                if space.momentum is not None and previous.momentum is not None:
                    space.momentum.copy_(first_models(previous.momentum, layout, previous.width, width))
                space.loss_sums.copy_(previous.loss_sums[:width])
                for name, (mean, var) in space.running.items():
                    mean.copy_(previous.running[name][0][:width])
                    var.copy_(previous.running[name][1][:width])
                for key, value in previous.constants.items():
                    space.constants[key].copy_(value[:width])
            space.lr.fill_(job.lr)
        return space

    def _leave(self, space: Workspace, keep: int, trained: torch.Tensor, losses: torch.Tensor) -> None:
        """Write the clients from ``keep`` on, whose training ended, from ``space`` into the results."""
        size = self.flat.layout.size
        with torch.no_grad():
            trained[keep : space.width, :size] = client_major(space.stack, self.flat.layout, space.width)[keep:]
            losses[keep : space.width] = space.loss_sums[keep:]
            for name, (mean, var) in space.running.items():
                trained[keep : space.width, self._buffer(name, "running_mean")] = mean[keep:]
                trained[keep : space.width, self._buffer(name, "running_var")] = var[keep:]

    def _buffer(self, layer: str, stat: str) -> slice:
        """Where a BatchNorm layer's running statistic lies in a state (parameters, then buffers)."""
        within = self.flat.buffer_layout.index(f"{layer}.{stat}")
        return slice(self.flat.layout.size + within.start, self.flat.layout.size + within.stop)

    def _workspace(self, width: int, plan: StackPlan, x: torch.Tensor, buffers: int,
                   constants: dict[str, torch.Tensor], job: ClientJob) -> Workspace:
        """A workspace for ``width`` clients: the one kept for this shape, else a new one (kept while they fit)."""
        key = (width, plan.batch, plan.weight is not None, tuple(x.shape[1:]), x.dtype, bool(job.train.momentum),
               tuple((k, tuple(v.shape[1:]), v.dtype) for k, v in constants.items()))
        if key in self._kept:
            return self._kept[key]
        device, size = x.device, self.flat.layout.size
        stack = torch.empty(width * size, device=device)
        channels = {name: self.flat.buffer_layout.index(f"{name}.running_mean") for name in self.batch_norms}
        space = Workspace(
            width, stack, torch.empty_like(stack) if job.train.momentum else None,
            {name: (torch.empty(width, s.stop - s.start, device=device), torch.empty(width, s.stop - s.start,
                                                                                   device=device))
             for name, s in channels.items()},
            {k: torch.empty(width, *v.shape[1:], dtype=v.dtype, device=device) for k, v in constants.items()},
            torch.empty(width, device=device), torch.empty(plan.batch * width, *x.shape[1:], dtype=x.dtype,
                                                           device=device),
            torch.empty(plan.batch * width, dtype=torch.long, device=device),
            torch.empty(plan.batch, width, device=device) if plan.weight is not None else None,
            torch.empty((), device=device),
        )
        nbytes = sum(t.numel() * t.element_size() for t in space.mutable()) + space.inputs.nbytes
        if self.graphs.enabled and self._kept_bytes + nbytes <= WORKSPACE_FRACTION * torch.cuda.mem_get_info(device)[0]:
            self._kept[key] = space
            self._kept_bytes += nbytes
        return space

    def _key(self, space: Workspace, extra: bool) -> Hashable | None:
        """What a captured step is specific to: its workspace, and whether it adds the client half's term; None
        for a workspace made for this call alone (its step runs eagerly)."""
        return (id(space), extra) if any(kept is space for kept in self._kept.values()) else None

    # --- the step ------------------------------------------------------------------------------
    def _step(self, space: Workspace, current: dict[str, Any], client_half: Any, batch: int,
              job: ClientJob) -> Callable[[], None]:
        """One stacked SGD step on ``space`` (its inputs already gathered); ``client_half`` adds its term when given."""
        module, layout, names, width = self.flat.module, self.flat.layout, self.flat.layout.names, space.width
        train = job.train
        one = unit(space.stack.device)

        def step() -> None:
            params = space.stack.detach().requires_grad_(True)
            current["width"] = width
            current.update(zip(names, layout.stacked_views(params, width)))
            for name, (mean, var) in space.running.items():
                current[f"{name}#running"] = (mean.view(-1), var.view(-1))
            channels = space.inputs.shape[1]
            logits = module(space.inputs.view(batch, width * channels, *space.inputs.shape[2:]))
            losses = F.cross_entropy(logits.view(batch * width, -1), space.labels, reduction="none").view(batch, width)
            if space.weight is None:
                per_client = losses.mean(dim=0)
            else:
                per_client = (losses * space.weight).sum(dim=0) / space.weight.sum(dim=0).clamp_min(1.0)
            loss = per_client.sum()
            if client_half is not None:
                loss = loss + _extra_loss(client_half, [current[n] for n in names], space.constants)
            loss.backward(one)
            assert params.grad is not None
            with torch.no_grad():
                _sgd_update(space.stack, params.grad, space.lr, train.momentum, train.weight_decay, space.momentum)
                space.loss_sums.add_(per_client.detach())

        return step


def _stack_constants(per_client: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    if not per_client or not per_client[0]:
        return {}
    return {key: torch.stack([c[key] for c in per_client]) for key in per_client[0]}


def _extra_loss(client_half: Any, params: list[torch.Tensor], constants: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The client half's term (``functional_extra_loss``, 0 where it adds none), summed over the clients."""
    def term(own: list[torch.Tensor], consts: Mapping[str, torch.Tensor]) -> torch.Tensor:
        value = client_half.functional_extra_loss(own, consts)
        return own[0].new_zeros(()) if value is None else value

    return torch.func.vmap(term, in_dims=(0, 0 if constants else None))(params, dict(constants)).sum()


def _sgd_update(
    params: torch.Tensor, grad: torch.Tensor, lr: torch.Tensor, momentum: float, weight_decay: float,
    buffer: torch.Tensor | None,
) -> None:
    """One SGD step on a stack (``rayfed.train.sgd.sgd_step`` on every client at once), the learning rate a
    tensor so that a captured step reads the round's."""
    if weight_decay:
        grad = grad.add(params, alpha=weight_decay)
    if buffer is not None:
        buffer.mul_(momentum).add_(grad)
        grad = buffer
    params.addcmul_(grad, lr, value=-1.0)
