"""Stacked client training: C clients of one architecture trained as one model C times as wide.

The clients' parameters form a stack. A stacked step runs the architecture's own ``forward`` on B
"samples" that each hold one sample of every client: activations are (B, C·channels, ...), client
c's channels at c·channels, so a client is a group of channels. Every layer that holds parameters
is driven by its stacked form (:mod:`rayfed.train.stacked_layers`): a convolution is one grouped
convolution, a linear layer one batched matrix product, a BatchNorm layer one batch norm over the
C·channels channels with each client's own running statistics; dropout draws each client's own masks
(:mod:`rayfed.train.dropout`). Every other layer acts on each channel and runs as it is, so a stacked
step issues about as many operations as one client's step, whatever C. The phase's hooks run for every
client at once under ``torch.func.vmap`` (:class:`~rayfed.train.rule.PhaseRule`).

Clients take different numbers of steps (their data sizes differ). They are ordered by their step
count, longest first, and at step s only the clients that still have a step train: a prefix of the
stack, so no step is spent on a client that has finished (:class:`~rayfed.train.stack_plan.StackPlan`).
Each client draws its batches as the sequential loop does; a short last batch
(``train.drop_last=False``) is padded with samples of weight 0. The result equals the sequential
path within float tolerance (tests/train/test_stacked.py).

A step of ``width`` clients reads and writes only its workspace (a :class:`~rayfed.train.step_io.StepIO`),
so on a GPU it is captured once per width as a CUDA graph and replayed (:mod:`rayfed.train.graphs`);
workspaces stay allocated from call to call while they fit :data:`WORKSPACE_FRACTION` of the GPU's free
memory.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rayfed.data.augment import apply_augment
from rayfed.train.batches import draw_batches
from rayfed.train.dropout import SEEDED_DROPOUT, client_dropout
from rayfed.train.flat import FlatModel
from rayfed.train.graphs import StepGraphs
from rayfed.train.job import ClientJob
from rayfed.train.layout import ParamLayout
from rayfed.train.phase import Adam, Outputs, Phase
from rayfed.train.rule import CARRY, CONSTANTS, PhaseRule
from rayfed.train.sequential import backward_from, captured_features, phase_seed, trained_range, unit
from rayfed.train.stack_plan import StackPlan, client_major, first_models, parameter_major
from rayfed.train.stacked_layers import stacked_layers
from rayfed.train.step_io import StepIO
from rayfed.train.update import adam_scalars

__all__ = ["StackOutcome", "StackedTraining", "WORKSPACE_FRACTION"]

WORKSPACE_FRACTION = 0.1
"""Workspaces stay allocated between calls (so their captured steps can be replayed) while they take at
most this share of the GPU's free memory; beyond it a call allocates its own and runs eagerly."""
_PER_CLIENT = (CONSTANTS, CARRY, "bn.")
"""Workspace entries with one row per client ((width, ...)): they shrink by keeping their first rows."""


@dataclass
class StackOutcome:
    """What a stack's phase leaves, every tensor with one row per client in the order of the jobs."""

    trained: torch.Tensor
    """(C, S) the trained models: parameters, then floating-point buffers."""
    loss_sums: torch.Tensor
    """(C,) each client's summed reported loss."""
    steps: list[int]
    carry: dict[str, torch.Tensor]
    momentum: torch.Tensor | None
    """(C, trained range) the momentum buffers, for ``SGD.keep_momentum``."""


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
        self.batch_norms = [name for name, layer in flat.module.named_modules() if isinstance(layer, nn.BatchNorm2d)]
        self._kept: dict[Hashable, StepIO] = {}
        self._kept_bytes = 0

    def run(
        self,
        jobs: Sequence[ClientJob],
        phases: Sequence[Phase],
        phase_index: int,
        starts: torch.Tensor,
        momentum: torch.Tensor | None,
        replays: bool,
    ) -> StackOutcome:
        """Train ``jobs`` through their ``phases`` (one signature) from ``starts`` (C, S); ``momentum`` (C, trained
        range) continues the clients' kept buffers; ``replays`` allows CUDA graphs."""
        phase, flat, train, device = phases[0], self.flat, jobs[0].train, starts.device
        data = [p.inputs if p.inputs is not None else (j.x_train, j.y_train) for p, j in zip(phases, jobs)]
        batches = draw_batches(
            [(job.generator, int(y.shape[0])) for job, (_, y) in zip(jobs, data)],
            epochs=phase.epochs,
            batch=phase.batch_size or train.batch_size,
            drop_last=train.drop_last if phase.drop_last is None else phase.drop_last,
            views=phase.views,
            augment=phase.augment,
            image_size=tuple(data[0][0].shape[1:]),
        )
        longest = max(b.steps for b in batches)
        adam = [adam_scalars(jobs[0].lr, phase.optimizer.betas, longest)] if isinstance(phase.optimizer, Adam) else []
        seeds = np.array([phase_seed(job, phase_index) for job in jobs], dtype=np.int64)
        plan = StackPlan.of(batches, [int(y.shape[0]) for _, y in data], device, [seeds, *adam])
        order = plan.order
        rule = PhaseRule(phase, train, stacked=True)
        lo, hi = trained_range(phase, flat)
        sub = _sub_layout(flat.layout, lo, hi)
        order_index = plan.order_index
        ordered = starts[order_index]
        if phase.load is not None:
            (a, b), _ = phase.load
            ordered[:, a:b] = torch.stack([phases[c].load[1] for c in order])  # type: ignore[index]
        trained = ordered.clone()  # the rows of finished clients are written as they finish
        carry = {k: v[order_index] for k, v in _stacked_carry(phases).items()}
        out = _Out(
            trained,
            torch.zeros(len(jobs), device=device),
            carry,
            None if momentum is None else momentum[order_index].clone(),
        )
        if longest == 0:
            return self._outcome(out, plan)
        x = torch.cat([data[c][0] for c in order])
        y = torch.cat([data[c][1] for c in order])
        first = self._first(phases, ordered, momentum, rule, (lo, hi), sub, plan, jobs[0].lr)
        space: StepIO | None = None
        flat.module.train()
        with (
            stacked_layers(flat.module) as current,
            client_dropout(flat.module) as dropout,
            captured_features(flat.module, phase.features) as captured,
        ):
            for s, width in enumerate(plan.active):
                if space is None or width < space["width"]:
                    space = self._enter(space, width, first, out, plan, x, y, (lo, hi), sub, replays, rule)
                rows = plan.index[s, :, :width].reshape(-1)
                torch.index_select(x, 0, rows, out=space["inputs"])
                torch.index_select(y, 0, rows, out=space["labels"])
                if plan.weight is not None:
                    space["weight"].copy_(plan.weight[s, :, :width])
                if plan.draws is not None:
                    space["draws"].copy_(plan.draws[s, :, :, :width].reshape(space["draws"].shape))
                if adam:
                    space["adam"].copy_(plan.extra[1][s])
                dropout.update(
                    seeds=space["seeds"], width=width, step=space["step"], views=phase.views, batch=plan.batch
                )
                step = self._step(space, current, captured, rule, (lo, hi), sub, plan.batch)
                self.graphs.run(self._key(space, phase), step, self._mutable(space))
        if space is not None:
            self._leave(space, 0, out, (lo, hi), sub, rule)
        return self._outcome(out, plan)

    # --- workspaces ------------------------------------------------------------------------------
    def _first(
        self,
        phases: Sequence[Phase],
        ordered: torch.Tensor,
        momentum: torch.Tensor | None,
        rule: PhaseRule,
        trained: tuple[int, int],
        sub: ParamLayout,
        plan: StackPlan,
        lr: float,
    ) -> dict[str, torch.Tensor]:
        """Everything a step of the whole stack starts from, in stack order."""
        layout, size, device = self.flat.layout, self.flat.layout.size, ordered.device
        order = plan.order
        first: dict[str, torch.Tensor] = {"stack": parameter_major(ordered[:, :size], layout)}
        block = first["stack"][len(order) * trained[0] : len(order) * trained[1]]
        for name, value in rule.optimizer_state(block).items():
            first[f"opt.{name}"] = value
        if momentum is not None and "opt.momentum" in first:
            first["opt.momentum"] = parameter_major(momentum[plan.order_index], sub)
        for name in self.batch_norms:
            first[f"bn.{name}.mean"] = ordered[:, self._buffer(name, "running_mean")].contiguous()
            first[f"bn.{name}.var"] = ordered[:, self._buffer(name, "running_var")].contiguous()
        for key in phases[0].constants:
            first[CONSTANTS + key] = torch.stack([phases[c].constants[key] for c in order])
        for key in phases[0].carry:
            first[CARRY + key] = torch.stack([phases[c].carry[key] for c in order])
        first["seeds"] = plan.extra[0][plan.order_index]
        first["lr"] = torch.full((), lr, device=device)
        first["loss_sums"] = torch.zeros(len(order), device=device)
        first["step"] = torch.zeros((), dtype=torch.int64, device=device)
        return first

    def _enter(
        self,
        previous: StepIO | None,
        width: int,
        first: dict[str, torch.Tensor],
        out: _Out,
        plan: StackPlan,
        x: torch.Tensor,
        y: torch.Tensor,
        trained: tuple[int, int],
        sub: ParamLayout,
        replays: bool,
        rule: PhaseRule,
    ) -> StepIO:
        """The workspace of the first ``width`` clients, filled from ``previous`` (the clients from ``width`` on
        finished: their rows are written out) or, at the first step, from ``first``."""
        source: dict[str, torch.Tensor] = first
        if previous is not None:
            self._leave(previous, width, out, trained, sub, rule)
            source = previous.values
        prior = previous["width"] if previous is not None else len(plan.order)
        views = plan.draws.shape[1] if plan.draws is not None else 1
        shapes = {
            "inputs": (plan.batch * width, *x.shape[1:]),
            "labels": (plan.batch * width, *y.shape[1:]),
            "weight": (plan.batch, width) if plan.weight is not None else None,
            "draws": (views, plan.batch * width, plan.draws.shape[-1]) if plan.draws is not None else None,
            "adam": (2,) if rule.phase.optimizer.__class__ is Adam else None,
        }
        space = self._workspace(width, rule.phase, shapes, x, y, source, replays)
        layout = self.flat.layout
        with torch.no_grad():
            for name, value in source.items():
                if name == "width" or not isinstance(value, torch.Tensor) or name in shapes:
                    continue
                if name == "stack":
                    value = first_models(value, layout, prior, width) if prior != width else value
                elif name.startswith("opt."):
                    value = first_models(value, sub, prior, width) if prior != width else value
                elif name.startswith(_PER_CLIENT) or name in ("loss_sums", "seeds"):
                    value = value[:width]
                space.put(name, value)
        space.values["width"] = width
        return space

    def _workspace(
        self,
        width: int,
        phase: Phase,
        shapes: dict[str, tuple[int, ...] | None],
        x: torch.Tensor,
        y: torch.Tensor,
        source: dict[str, torch.Tensor],
        replays: bool,
    ) -> StepIO:
        """A workspace for ``width`` clients: the one kept for this shape, else a new one (kept while they fit)."""
        static = replays and self.graphs.fixed
        key = (width, phase.signature(), tuple(shapes.items()), x.dtype, y.dtype)
        if static and key in self._kept:
            return self._kept[key]
        space = StepIO(static)
        for name, shape in shapes.items():
            if shape is not None:
                dtype = (
                    x.dtype
                    if name == "inputs"
                    else y.dtype
                    if name == "labels"
                    else (torch.float64 if name == "draws" else torch.float32)
                )
                space.values[name] = torch.empty(shape, dtype=dtype, device=x.device)
        if static:
            nbytes = sum(t.numel() * t.element_size() for t in source.values() if isinstance(t, torch.Tensor))
            on_gpu = x.device.type == "cuda"  # a CPU keeps fixed workspaces only to run the replay path's code
            if not on_gpu or self._kept_bytes + nbytes <= WORKSPACE_FRACTION * torch.cuda.mem_get_info(x.device)[0]:
                self._kept[key] = space
                self._kept_bytes += nbytes
        return space

    def _leave(
        self, space: StepIO, keep: int, out: _Out, trained: tuple[int, int], sub: ParamLayout, rule: PhaseRule
    ) -> None:
        """Write the clients from ``keep`` on, whose training ended, from ``space`` into ``out``, after the phase's
        ``on_train_end`` (run on a copy: the clients before ``keep`` train on)."""
        width, size = space["width"], self.flat.layout.size
        if rule.phase.on_train_end is not None:
            ended = StepIO(False)
            ended.values = {
                **space.values,
                "stack": space["stack"].clone(),
                **{CARRY + k: v.clone() for k, v in space.group(CARRY).items()},
            }
            rule.edit_params("on_train_end", self.flat.layout.stacked_views(ended["stack"], width), ended)
            space = ended
        with torch.no_grad():
            out.trained[keep:width, :size] = client_major(space["stack"], self.flat.layout, width)[keep:]
            out.loss_sums[keep:width] = space["loss_sums"][keep:]
            for name in self.batch_norms:
                out.trained[keep:width, self._buffer(name, "running_mean")] = space[f"bn.{name}.mean"][keep:]
                out.trained[keep:width, self._buffer(name, "running_var")] = space[f"bn.{name}.var"][keep:]
            for key, value in space.group(CARRY).items():
                out.carry[key][keep:width] = value[keep:]
            momentum = space.get("opt.momentum")
            if momentum is not None and out.momentum is not None:
                out.momentum[keep:width] = client_major(momentum, sub, width)[keep:]

    @staticmethod
    def _outcome(out: _Out, plan: StackPlan) -> StackOutcome:
        """``out`` (in stack order) back in the order of the jobs."""
        back = plan.back
        momentum = None if out.momentum is None else out.momentum[back]
        return StackOutcome(
            out.trained[back], out.loss_sums[back], plan.steps, {k: v[back] for k, v in out.carry.items()}, momentum
        )

    def _buffer(self, layer: str, stat: str) -> slice:
        """Where a BatchNorm layer's running statistic lies in a state (parameters, then buffers)."""
        within = self.flat.buffer_layout.index(f"{layer}.{stat}")
        return slice(self.flat.layout.size + within.start, self.flat.layout.size + within.stop)

    def _key(self, space: StepIO, phase: Phase) -> Hashable | None:
        """What a captured step is specific to: its workspace; None for one made for this call alone (eager)."""
        return (id(space), phase.signature()) if any(kept is space for kept in self._kept.values()) else None

    @staticmethod
    def _mutable(space: StepIO) -> list[torch.Tensor]:
        """The workspace tensors a step changes."""
        return [
            space["stack"],
            space["loss_sums"],
            space["step"],
            *space.tensors("opt."),
            *space.tensors("bn."),
            *space.tensors(CARRY),
        ]

    # --- the step ------------------------------------------------------------------------------
    def _views(
        self, space: StepIO, current: dict, trained: tuple[int, int], sub: ParamLayout
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Every parameter of the stack as (width, *shape), those in the trained range views of a leaf that
        requires gradients (returned too); the layers read them from ``current``."""
        width, layout, stack = space["width"], self.flat.layout, space["stack"]
        if trained == (0, layout.size):  # every parameter trains: the leaf is the whole stack
            leaf = stack.detach().requires_grad_(True)
            views = layout.stacked_views(leaf, width)
        else:
            leaf = stack[width * trained[0] : width * trained[1]].detach().requires_grad_(True)
            views = layout.stacked_views(stack.detach(), width)
            first = layout.offsets.index(trained[0])
            views[first : first + len(sub.names)] = sub.stacked_views(leaf, width)
        current["width"] = width
        current.update(zip(layout.names, views))
        for name in self.batch_norms:
            current[f"{name}#running"] = (space[f"bn.{name}.mean"].view(-1), space[f"bn.{name}.var"].view(-1))
        return views, leaf

    def _step(
        self,
        space: StepIO,
        current: dict,
        captured: list[torch.Tensor],
        rule: PhaseRule,
        trained: tuple[int, int],
        sub: ParamLayout,
        batch: int,
    ) -> Callable[[], None]:
        """One stacked step on ``space`` (its inputs already gathered)."""
        phase, module, width = rule.phase, self.flat.module, space["width"]
        stack = space["stack"]
        block = stack if trained == (0, self.flat.layout.size) else stack[width * trained[0] : width * trained[1]]
        state = space.group("opt.")
        one = unit(block.device)

        counted = phase.loss is not None or any(isinstance(m, SEEDED_DROPOUT) for m in module.modules())

        def plain() -> list[torch.Tensor]:
            return self.flat.layout.stacked_views(space["stack"], width)

        def step() -> None:
            if phase.on_train_batch_start is not None:  # edits through plain views, before autograd sees any
                rule.edit_params("on_train_batch_start", plain(), space)
            params, leaf = self._views(space, current, trained, sub)
            x = space["inputs"]
            if phase.augment is not None:
                mean, std = self.pixel_scale(x)
                x = torch.cat(
                    [apply_augment(x, space["draws"][v], mean, std, phase.augment) for v in range(phase.views)]
                )
            x = x.view(x.shape[0] // width, width * x.shape[1], *x.shape[2:])
            outputs = phase.forward(module, x) if phase.forward is not None else Outputs(module(x), None)
            if phase.features is not None and phase.forward is None:
                outputs = Outputs(outputs.logits, captured.pop())
            labels, weight = space["labels"], space.get("weight")
            reported = rule.cross_entropy(outputs.logits, labels, weight, width) if phase.cross_entropy else None
            total = None if reported is None else reported.sum()
            if phase.loss is not None:
                term = rule.term(outputs, labels, weight, space["step"], params, space.group(CONSTANTS), width)
                total = term.sum() if total is None else total + term.sum()
                reported = term if reported is None else reported
            assert total is not None and reported is not None
            backward_from(total, one)
            grad = leaf.grad
            assert grad is not None
            if phase.on_after_backward is not None:  # every parameter's gradient; None where one is frozen
                grads: list[torch.Tensor | None] = [None] * len(params)
                first = self.flat.layout.offsets.index(trained[0])
                grads[first : first + len(sub.names)] = sub.stacked_views(grad, width)
                rule.edit_grads(params, grads, space)
            with torch.no_grad():
                rule.update(block, grad, state, space["lr"], space.get("adam"))
            if phase.on_after_optimizer_step is not None:
                rule.edit_params("on_after_optimizer_step", plain(), space)
            with torch.no_grad():
                if counted:
                    space["step"].add_(1)
                space["loss_sums"].add_(reported.detach())

        return step


@dataclass
class _Out:
    trained: torch.Tensor
    loss_sums: torch.Tensor
    carry: dict[str, torch.Tensor]
    momentum: torch.Tensor | None


def _sub_layout(layout: ParamLayout, lo: int, hi: int) -> ParamLayout:
    """The layout of the parameters in [lo, hi) of ``layout``'s vector, as a vector of their own."""
    first, last = layout.offsets.index(lo), layout.offsets.index(hi)
    return ParamLayout(
        layout.names[first:last],
        layout.shapes[first:last],
        tuple(o - lo for o in layout.offsets[first : last + 1]),
        layout.channels_last[first:last] if layout.channels_last else (),
    )


def _stacked_carry(phases: Sequence[Phase]) -> dict[str, torch.Tensor]:
    """The phases' starting carries, one row per client (a stack that took no step)."""
    return {k: torch.stack([p.carry[k] for p in phases]) for k in phases[0].carry}
