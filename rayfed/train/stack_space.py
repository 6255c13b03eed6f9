"""The workspace of a stack of clients in training: what its steps read and change, as typed fields.

A stacked phase (:mod:`rayfed.train.stacked`) trains its clients in lanes, longest first, as a prefix of the stack
that narrows when lanes finish. :class:`StackSpace` holds the ``width`` lanes still training: their
parameters as one parameter-major stack, each BatchNorm layer's running statistics, the step's
:class:`~rayfed.train.workspace.StepState` (one row per lane) and its batch
(:class:`~rayfed.train.workspace.StepInputs`, allocated for ``width`` lanes so a captured step reads them).
:meth:`StackSpace.narrowed` holds the first lanes' when the others finish, :meth:`StackSpace.write_out` writes
finished clients' rows into the phase's :class:`StackOutcome`, and :meth:`StackSpace.take_lane` starts a lane's
next client (packed lanes, :mod:`rayfed.train.lanes`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rayfed.train.flat import FlatModel
from rayfed.train.layout import ParamLayout
from rayfed.train.rule import PhaseRule
from rayfed.train.stack_layout import client_major, first_models
from rayfed.train.stack_plan import StackPlan
from rayfed.train.update import OptimizerState
from rayfed.train.workspace import StepInputs, StepState

__all__ = ["StackOutcome", "StackSpace", "LaneStart"]


@dataclass
class StackOutcome:
    """What a stacked phase leaves, one row per client: in stack order while clients finish and are written out
    (:meth:`StackSpace.write_out`), then in the order of the jobs (:meth:`in_job_order`)."""

    trained: torch.Tensor
    """(C, S) the trained models: parameters, then floating-point buffers."""
    loss_sums: torch.Tensor
    """(C,) each client's summed reported loss."""
    steps: list[int]
    """Each client's step count."""
    extra: dict[str, torch.Tensor]
    """Each trainable's final values, (C, ...)."""
    momentum: torch.Tensor | None
    """(C, trained range) the momentum buffers, for ``SGD.keep_momentum``."""

    def in_job_order(self, plan: StackPlan) -> StackOutcome:
        """This outcome, in stack order, back in the order of the jobs of ``plan``."""
        back = plan.back
        momentum = None if self.momentum is None else self.momentum[back]
        extra = {k: v[back] for k, v in self.extra.items()}
        return StackOutcome(self.trained[back], self.loss_sums[back], plan.steps, extra, momentum)


@dataclass
class StackSpace:
    """The workspace of the ``width`` clients of a stack that train (module docstring)."""

    width: int
    stack: torch.Tensor
    """Every client's parameters, parameter-major (:meth:`~rayfed.train.layout.ParamLayout.stacked_views`)."""
    batch_norm: dict[str, tuple[torch.Tensor, torch.Tensor]]
    """Each BatchNorm layer's running (mean, var), (width, channels)."""
    state: StepState
    batch: StepInputs = field(default_factory=StepInputs)

    def mutable(self) -> list[torch.Tensor]:
        """The tensors a step changes."""
        return [self.stack, *(t for pair in self.batch_norm.values() for t in pair), *self.state.mutable()]

    def narrowed(self, width: int, layout: ParamLayout, sub: ParamLayout) -> StackSpace:
        """The values of the first ``width`` clients (the others finished), in a new unallocated space."""
        prior = self.width

        def rows(t: torch.Tensor) -> torch.Tensor:
            return t[:width]

        def major(t: torch.Tensor | None, of: ParamLayout) -> torch.Tensor | None:
            return None if t is None else first_models(t, of, prior, width)

        s = self.state
        optimizer = OptimizerState(
            *(major(t, sub) for t in (s.optimizer.momentum, s.optimizer.exp_avg, s.optimizer.exp_avg_sq))
        )
        state = StepState(
            lr=s.lr if s.lr.dim() == 0 else first_models(s.lr, sub, prior, width),  # one rate, or one a lane
            step=s.step if s.step is None or s.step.dim() == 0 else rows(s.step),
            seeds=None if s.seeds is None else rows(s.seeds),
            constants={k: rows(v) for k, v in s.constants.items()},
            optimizer=optimizer,
            extra={k: rows(v) for k, v in s.extra.items()},
            extra_lr=s.extra_lr,
            extra_optimizer={
                k: OptimizerState(*(None if t is None else rows(t) for t in (o.momentum, o.exp_avg, o.exp_avg_sq)))
                for k, o in s.extra_optimizer.items()
            },
            loss_sums=None if s.loss_sums is None else rows(s.loss_sums),
        )
        norms = {name: (rows(mean), rows(var)) for name, (mean, var) in self.batch_norm.items()}
        return StackSpace(width, first_models(self.stack, layout, prior, width), norms, state)

    def copied(self) -> StackSpace:
        """This space's values in storage of their own (a workspace kept from call to call)."""
        norms = {name: (mean.clone(), var.clone()) for name, (mean, var) in self.batch_norm.items()}
        return StackSpace(self.width, self.stack.clone(), norms, self.state.copy())

    def take(self, values: StackSpace) -> None:
        """Copy ``values`` (of the same width and phase) into this space's tensors, which a captured step reads."""
        self.stack.copy_(values.stack)
        for name, (mean, var) in values.batch_norm.items():
            held_mean, held_var = self.batch_norm[name]
            held_mean.copy_(mean)
            held_var.copy_(var)
        self.state.refill(values.state)

    def write_out(
        self,
        rows: slice,
        slot: int,
        out: StackOutcome,
        flat: FlatModel,
        sub: ParamLayout,
        rule: PhaseRule,
        buffers: dict[str, tuple[slice, slice]],
    ) -> None:
        """Write the lanes ``rows``, whose clients' training ended, into ``out`` from ``slot`` on, after the phase's
        ``on_train_end`` (run on copies: the other lanes train on)."""
        width, layout = self.width, flat.layout
        stack, state = self.stack, self.state
        slots = slice(slot, slot + len(range(*rows.indices(width))))
        if rule.phase.on_train_end is not None:
            stack = stack.clone()
            state = StepState(**{**vars(state), "extra": {k: v.clone() for k, v in state.extra.items()}})
            rule.edit_params("on_train_end", layout.stacked_views(stack, width), state)
        with torch.no_grad():
            out.trained[slots, : layout.size] = client_major(stack, layout, width)[rows]
            if state.loss_sums is not None:
                out.loss_sums[slots] = state.loss_sums[rows]
            for name, (mean, var) in self.batch_norm.items():
                at_mean, at_var = buffers[name]
                out.trained[slots, at_mean] = mean[rows]
                out.trained[slots, at_var] = var[rows]
            for name, value in state.extra.items():
                out.extra[name][slots] = value[rows]
            momentum = state.optimizer.momentum
            if momentum is not None and out.momentum is not None:
                out.momentum[slots] = client_major(momentum, sub, width)[rows]

    def take_lane(self, lane: int, client: LaneStart, layout: ParamLayout, sub: ParamLayout) -> None:
        """Start ``client`` in ``lane``, whose previous client was written out: its model, running statistics,
        seed, constants and trainables, a new optimiser's buffers (or its kept momentum), no loss, step 0, and its
        learning rate where each lane has its own."""
        width, state = self.width, self.state
        with torch.no_grad():
            for target, value in zip(layout.stacked_views(self.stack, width), layout.views(client.model)):
                target[lane].copy_(value)
            for name, (mean, var) in self.batch_norm.items():
                mean[lane].copy_(client.norms[name][0])
                var[lane].copy_(client.norms[name][1])
            if state.seeds is not None:
                state.seeds[lane].copy_(client.seed)
            for name, value in state.constants.items():
                value[lane].copy_(client.constants[name])
            for name, value in state.extra.items():
                value[lane].copy_(client.extra[name])
                for buffer in state.extra_optimizer[name].tensors():
                    buffer[lane].zero_()
            optimizer = state.optimizer
            for buffer in optimizer.tensors():
                kept = client.momentum if buffer is optimizer.momentum else None
                starts = sub.views(kept) if kept is not None else [None] * len(sub.names)
                for target, start in zip(sub.stacked_views(buffer, width), starts):
                    if start is None:
                        target[lane].zero_()
                    else:
                        target[lane].copy_(start)
            if state.loss_sums is not None:
                state.loss_sums[lane].zero_()
            if state.step is not None:
                state.step[lane].zero_()
            if state.lr.dim():  # a rate per lane: runs packed together (rayfed.train.stacked.lane_rates)
                for target in sub.stacked_views(state.lr, width):
                    target[lane].fill_(client.lr)


@dataclass(frozen=True)
class LaneStart:
    """What a client starts a lane from (:meth:`StackSpace.take_lane`)."""

    model: torch.Tensor
    """Its flat parameters (client-major, (P,))."""
    norms: dict[str, tuple[torch.Tensor, torch.Tensor]]
    seed: torch.Tensor
    constants: dict[str, torch.Tensor]
    extra: dict[str, torch.Tensor]
    momentum: torch.Tensor | None
    """Its kept momentum over the trained range, None for a new optimiser's."""
    lr: float
    """Its learning rate (read where the stack's lanes have one each)."""
