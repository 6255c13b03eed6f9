"""Stacked client training: C clients of one architecture trained as one model C times as wide.

The clients' parameters form a stack. A stacked step runs the architecture's own ``forward`` on B
"samples" that each hold one sample of every client: activations are (B, C·channels, ...), client
c's channels at c·channels, so a client is a group of channels. Every layer that holds parameters
is driven by its stacked form (:mod:`rayfed.train.stacked_layers`): a convolution is one grouped
convolution, a linear layer one batched matrix product, a BatchNorm layer one batch norm over the
C·channels channels with each client's own running statistics; dropout draws each client's own masks
(:mod:`rayfed.train.dropout`). Every other layer acts on each channel and runs as it is, so a stacked
step issues about as many operations as one client's step, whatever C. The step is the one step
(:func:`~rayfed.train.step.make_step`) on the stack (:class:`StackModel`); the phase's hooks run for every
client at once under ``torch.func.vmap`` (:class:`~rayfed.train.rule.PhaseRule`).

Clients take different numbers of steps (their data sizes differ). Each client trains in a lane of the stack, one
client a lane or, packed, a lane taking its next client when its current one finishes (its row written out, the
next client's values taking the lane: :mod:`rayfed.train.lanes`). The lanes are ordered by their step counts,
longest first, and at step s only the lanes that still have a step train: a prefix of the stack, so no step is
spent on a lane that has finished (:class:`~rayfed.train.stack_plan.StackPlan`,
:class:`~rayfed.train.stack_space.StackSpace`). Each client draws its batches as the sequential loop does;
a short last batch (``train.drop_last=False``) is padded with samples of weight 0. The result equals the
sequential path within float tolerance (tests/train/test_stacked.py, tests/train/test_every_method_stacks.py).

On a GPU a step of ``width`` clients is captured once per width as a CUDA graph and replayed
(:mod:`rayfed.train.graphs`); its workspace stays allocated from call to call while the kept ones fit
:data:`WORKSPACE_FRACTION` of the GPU's free memory.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from rayfed.train.dropout import client_dropout
from rayfed.train.flat import FlatModel
from rayfed.train.graphs import StepGraphs
from rayfed.train.job import ClientJob
from rayfed.train.layout import ParamLayout
from rayfed.train.phase import Adam, Phase
from rayfed.train.rule import PhaseRule
from rayfed.train.stack_layout import parameter_major, sub_layout
from rayfed.train.stack_plan import StackPlan
from rayfed.train.stack_space import LaneStart, StackOutcome, StackSpace
from rayfed.train.stacked_layers import stacked_layers
from rayfed.train.stacking import stack_key
from rayfed.train.step import (
    LossRecord,
    backward_from,
    extra_lrs,
    make_step,
    phase_batches,
    phase_samples,
    phase_seed,
    reads_steps,
    trained_range,
    unit,
)
from rayfed.train.update import adam_scalars
from rayfed.train.workspace import StepState

__all__ = ["StackedTraining", "StackModel", "WORKSPACE_FRACTION", "lane_rates"]

WORKSPACE_FRACTION = 0.1
"""Workspaces stay allocated between calls (so their captured steps can be replayed) while they take at
most this share of the GPU's free memory; beyond it a call allocates its own and runs eagerly."""


class StackModel:
    """A step's view of a stack's models (:class:`~rayfed.train.step.StepModel`): the parameters of its
    :class:`~rayfed.train.stack_space.StackSpace`, read by the layers' stacked forms through ``current``."""

    def __init__(self, space: StackSpace, flat: FlatModel, trained: tuple[int, int], current: dict[str, Any]) -> None:
        self.space, self.module, self.width = space, flat.module, space.width
        self.layout, self.trained, self.current = flat.layout, trained, current
        self.sub = sub_layout(flat.layout, *trained)
        self._leaf: torch.Tensor | None = None
        self._whole = trained == (0, flat.layout.size)
        # The parameters outside the trained range, viewed once: the optimiser changes the stack in place.
        self._frozen = [] if self._whole else flat.layout.stacked_views(space.stack.detach(), space.width)

    def _block(self) -> torch.Tensor:
        lo, hi = self.trained
        stack = self.space.stack
        return stack if (lo, hi) == (0, self.layout.size) else stack[self.width * lo : self.width * hi]

    def plain(self) -> list[torch.Tensor]:
        return self.layout.stacked_views(self.space.stack, self.width)

    def begin(self) -> list[torch.Tensor]:
        """Every parameter as (width, *shape); those in the trained range are views of a leaf that requires
        gradients. The layers read them, and each BatchNorm layer its running statistics, from ``current``."""
        width, layout = self.width, self.layout
        leaf = self._block().detach().requires_grad_(True)
        if self._whole:  # every parameter trains: the leaf is the whole stack
            views = layout.stacked_views(leaf, width)
        else:
            views = list(self._frozen)
            first = layout.offsets.index(self.trained[0])
            views[first : first + len(self.sub.names)] = self.sub.stacked_views(leaf, width)
        self._leaf = leaf
        self.current["width"] = width
        self.current.update(zip(layout.names, views))
        for name, (mean, var) in self.space.batch_norm.items():
            self.current[f"{name}#running"] = (mean.view(-1), var.view(-1))
        return views

    def grads(self) -> list[torch.Tensor | None]:
        grad = self._gradient()
        grads: list[torch.Tensor | None] = [None] * len(self.layout.names)
        first = self.layout.offsets.index(self.trained[0])
        grads[first : first + len(self.sub.names)] = self.sub.stacked_views(grad, self.width)
        return grads

    def backward(self, loss: torch.Tensor) -> None:
        backward_from(loss, unit(loss.device))  # into the leaf's gradient, new every step

    def stepped(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return [self._block()], [self._gradient()]

    def pieces(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        return [buffer]

    def _gradient(self) -> torch.Tensor:
        assert self._leaf is not None and self._leaf.grad is not None
        return self._leaf.grad

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0] // self.width, self.width * x.shape[1], *x.shape[2:])


class StackedTraining:
    """Stacked phases on a worker's model of one architecture (:meth:`run`)."""

    def __init__(
        self,
        flat: FlatModel,
        graphs: StepGraphs,
        pixel_scale: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        self.flat = flat
        self.graphs = graphs
        self.pixel_scale = pixel_scale
        norms = [name for name, layer in flat.module.named_modules() if isinstance(layer, nn.BatchNorm2d)]
        self.buffers = {name: (self._buffer(name, "running_mean"), self._buffer(name, "running_var")) for name in norms}
        """Where each BatchNorm layer's running statistics lie in a state (parameters, then buffers)."""
        self._kept: dict[Hashable, StackSpace] = {}
        self._kept_bytes = 0

    def run(
        self,
        jobs: Sequence[ClientJob],
        phases: Sequence[Phase],
        phase_index: int,
        starts: torch.Tensor,
        momentum: torch.Tensor | None,
        replays: bool,
        where: str,
        pack: bool = False,
    ) -> StackOutcome:
        """Train ``jobs`` through their ``phases`` (one signature) from ``starts`` (C, S); ``momentum`` (C, trained
        range) continues the clients' kept buffers; ``replays`` allows CUDA graphs; ``where`` names the phase;
        ``pack`` packs the clients into lanes (:func:`~rayfed.train.lanes.packed_lanes`; a phase with Adam, whose
        scalars are the stack's step's, keeps a lane per client)."""
        phase, flat, device = phases[0], self.flat, starts.device
        data = [phase_samples(p, j) for p, j in zip(phases, jobs)]
        batches = phase_batches(phase, jobs, data)
        longest = max(b.steps for b in batches)
        adam = [adam_scalars(jobs[0].lr, phase.optimizer.betas, longest)] if isinstance(phase.optimizer, Adam) else []
        seeds = np.array([phase_seed(job, phase_index) for job in jobs], dtype=np.int64)
        sizes = [int(y.shape[0]) for _, y in data]
        plan = StackPlan.of(batches, sizes, device, [seeds, *adam], packed=pack and not adam)
        rule = PhaseRule(phase, jobs[0].train, stacked=True, where=where, shapes=flat.layout.shapes)
        trained = trained_range(phase, flat)
        sub = sub_layout(flat.layout, *trained)
        starting = _loaded(starts, phases)
        extra = {k: torch.stack([p.extra[k].value for p in phases]) for k in phase.extra}
        slotted = starting[plan.slot_index]
        out = StackOutcome(  # in slot order (:class:`StackPlan`): the clients are written out as they finish
            slotted.clone(),
            torch.zeros(len(jobs), device=device),
            plan.steps,
            {k: v[plan.slot_index] for k, v in extra.items()},
            None if momentum is None else momentum[plan.slot_index],
        )
        if longest == 0:
            return out.in_job_order(plan)
        x = torch.cat([inputs for inputs, _ in data])
        y = torch.cat([labels for _, labels in data])
        space: StackSpace | None = None
        flat.module.train()
        with (
            stacked_layers(flat.module) as current,
            client_dropout(flat.module) as dropout,
        ):
            for s, width in enumerate(plan.active):
                if space is None or width < space.width:
                    if space is None:
                        firsts = starting[plan.first_index] if plan.lanes.packed else _first_rows(slotted, width)
                        lrs = [job.lr for job in jobs]
                        values = self._first(phases, firsts, momentum, rule, trained, plan, lrs, extra)
                    else:
                        space.write_out(slice(width, space.width), width, out, flat, sub, rule, self.buffers)
                        values = space.narrowed(width, flat.layout, sub)
                    space = self._workspace(values, phase, plan, x, y, replays)
                    model = StackModel(space, flat, trained, current)
                    record = LossRecord(space.state)
                    step = make_step(model, rule, space.state, space.batch, record, self.pixel_scale)
                for switch in plan.switches.get(s, ()):  # a lane whose client finished takes its next one
                    start = self._lane_start(switch.client, jobs, phases, starting, momentum, plan, extra)
                    space.write_out(
                        slice(switch.lane, switch.lane + 1), switch.slot, out, flat, sub, rule, self.buffers
                    )
                    space.take_lane(switch.lane, start, flat.layout, sub)
                self._fill(space, plan, s, x, y)
                dropout.update(
                    seeds=space.state.seeds,
                    width=width,
                    step=space.state.step,
                    views=phase.samples.views,
                    batch=plan.batch,
                )
                self.graphs.run(self._key(space, phase), step, space.mutable())
        if space is not None:
            space.write_out(slice(0, space.width), 0, out, flat, sub, rule, self.buffers)
        return out.in_job_order(plan)

    def _lane_start(
        self,
        client: int,
        jobs: Sequence[ClientJob],
        phases: Sequence[Phase],
        starting: torch.Tensor,
        momentum: torch.Tensor | None,
        plan: StackPlan,
        extra: dict[str, torch.Tensor],
    ) -> LaneStart:
        """What ``client`` starts its lane from, as it would start a stack of its own."""
        row = starting[client]
        return LaneStart(
            row,
            {name: (row[mean], row[var]) for name, (mean, var) in self.buffers.items()},
            plan.extra[0][client],
            dict(phases[client].constants),
            {k: v[client] for k, v in extra.items()},
            None if momentum is None else momentum[client],
            jobs[client].lr,
        )

    @staticmethod
    def _fill(space: StackSpace, plan: StackPlan, s: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """Copy step ``s``'s batch of the clients still training (the first ``space.width``) into the workspace."""
        batch, width = space.batch, space.width
        assert batch.x is not None and batch.y is not None
        rows = plan.index[s, :, :width].reshape(-1)
        torch.index_select(x, 0, rows, out=batch.x)
        torch.index_select(y, 0, rows, out=batch.y)
        if plan.weight is not None and batch.weight is not None:
            batch.weight.copy_(plan.weight[s, :, :width])
        if plan.draws is not None and batch.draws is not None:
            batch.draws.copy_(plan.draws[s, :, :, :width].reshape(batch.draws.shape))
        if batch.adam is not None:
            batch.adam.copy_(plan.extra[1][s])

    # --- workspaces ------------------------------------------------------------------------------
    def _first(
        self,
        phases: Sequence[Phase],
        ordered: torch.Tensor,
        momentum: torch.Tensor | None,
        rule: PhaseRule,
        trained: tuple[int, int],
        plan: StackPlan,
        lrs: Sequence[float],
        extra: dict[str, torch.Tensor],
    ) -> StackSpace:
        """Everything a step of the whole stack starts from: each lane's first client's, whose starting states are
        ``ordered``; ``lrs`` are the jobs' learning rates (one 0-d rate where they agree, else one per lane:
        :func:`lane_rates`)."""
        layout, device, first, index = self.flat.layout, ordered.device, plan.first, plan.first_index
        stack = parameter_major(ordered[:, : layout.size], layout)
        block = stack[len(first) * trained[0] : len(first) * trained[1]]
        lead = phases[0]
        counts_steps = reads_steps(lead, self.flat.module)
        state = StepState.new(
            lead,
            block,
            rule.momentum,
            counts_steps=counts_steps,
            lr=lane_rates([lrs[c] for c in first], sub_layout(layout, *trained), device),
            seeds=plan.extra[0][index],
            constants={k: torch.stack([phases[c].constants[k] for c in first]) for k in lead.constants},
            extra={k: v[index] for k, v in extra.items()},
            extra_lr=extra_lrs(lead, device),
            loss_sums=torch.zeros(len(first), device=device),
        )
        if counts_steps and plan.lanes.packed:  # each lane counts its own client's steps
            state.step = torch.zeros(len(first), dtype=torch.int64, device=device)
        if momentum is not None and state.optimizer.momentum is not None:
            state.optimizer.momentum = parameter_major(momentum[index], sub_layout(layout, *trained))
        norms = {
            name: (ordered[:, mean].contiguous(), ordered[:, var].contiguous())
            for name, (mean, var) in self.buffers.items()
        }
        return StackSpace(len(first), stack, norms, state)

    def _workspace(
        self, values: StackSpace, phase: Phase, plan: StackPlan, x: torch.Tensor, y: torch.Tensor, replays: bool
    ) -> StackSpace:
        """A workspace holding ``values``: the one kept for this width and phase, else a new one (kept while they
        fit), its batch allocated for ``width`` clients."""
        width = values.width
        static = replays and self.graphs.fixed
        # A packed stack counts its lanes' steps apart (``StepState.step`` is one per lane).
        # A rate per lane (runs packed together, :func:`lane_rates`) or one: ``values.state.lr.dim()``.
        lanes = (plan.weight is not None, plan.lanes.packed, values.state.lr.dim())
        shapes = (plan.batch, tuple(x.shape[1:]), x.dtype, y.dtype, *lanes)
        key = (width, stack_key(phase), *shapes)
        if static and key in self._kept:
            space = self._kept[key]
            space.take(values)
            return space
        space = values.copied() if static else values
        batch, draws = space.batch, plan.draws
        batch.x = x.new_empty(plan.batch * width, *x.shape[1:])
        batch.y = y.new_empty(plan.batch * width, *y.shape[1:])
        batch.weight = None if plan.weight is None else torch.empty(plan.batch, width, device=x.device)
        if draws is not None:
            batch.draws = torch.empty(
                draws.shape[1], plan.batch * width, draws.shape[-1], dtype=torch.float64, device=x.device
            )
        batch.adam = torch.empty(2, device=x.device) if isinstance(phase.optimizer, Adam) else None
        if static:
            nbytes = sum(t.numel() * t.element_size() for t in space.mutable())
            on_gpu = x.device.type == "cuda"  # a CPU keeps fixed workspaces only to run the replay path's code
            if not on_gpu or self._kept_bytes + nbytes <= WORKSPACE_FRACTION * torch.cuda.mem_get_info(x.device)[0]:
                self._kept[key] = space
                self._kept_bytes += nbytes
        return space

    def _key(self, space: StackSpace, phase: Phase) -> Hashable | None:
        """What a captured step is specific to: its workspace; None for one made for this call alone (eager)."""
        return (id(space), stack_key(phase)) if any(kept is space for kept in self._kept.values()) else None

    def _buffer(self, layer: str, stat: str) -> slice:
        """Where a BatchNorm layer's running statistic lies in a state (parameters, then buffers)."""
        within = self.flat.buffer_layout.index(f"{layer}.{stat}")
        return slice(self.flat.layout.size + within.start, self.flat.layout.size + within.stop)


def _loaded(starts: torch.Tensor, phases: Sequence[Phase]) -> torch.Tensor:
    """The clients' starting states with what their phases load (``Phase.load``); ``starts`` itself without (it is
    read, never written: the rows taken from it are copies)."""
    if phases[0].load is None:
        return starts
    (a, b), _ = phases[0].load
    loaded = starts.clone()
    loaded[:, a:b] = torch.stack([p.load[1] for p in phases])  # type: ignore[index]
    return loaded


def lane_rates(lrs: Sequence[float], sub: ParamLayout, device: torch.device) -> torch.Tensor:
    """The learning rate of a stack's lanes: one 0-d rate when every lane's is the same (a run's stack, as
    always), else one per lane laid out as the trained block, parameter-major (runs packed into one stack that differ
    in ``train.lr``: :mod:`rayfed.execution.stack_merger`), so that one update multiplies each lane by its own."""
    if all(lr == lrs[0] for lr in lrs):
        return torch.full((), lrs[0], device=device)
    rows = torch.tensor(lrs, dtype=torch.float32, device=device)[:, None].expand(len(lrs), sub.size)
    return parameter_major(rows, sub)


def _first_rows(rows: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` of ``rows``: ``rows`` itself when that is all of them (no view to issue)."""
    return rows if count == len(rows) else rows[:count]
