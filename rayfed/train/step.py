"""One training step, written once for one client and for a stack of clients.

A step reads its batch (:class:`~rayfed.train.workspace.StepInputs`) and its state
(:class:`~rayfed.train.workspace.StepState`) and runs, in order: the ``on_train_batch_start`` edits, the forward
(with the batch's augmented views), the loss (cross-entropy and the phase's term,
:class:`~rayfed.train.rule.PhaseRule`), backward, the ``on_after_backward`` edits, the optimiser's update of the
trained parameters and of the trainables, the step count and the reported loss. What differs between one
client and a stack is only how the step sees the model, a :class:`StepModel`: the worker's model itself
(:mod:`rayfed.train.sequential`), or a stack of models driven through the layers' stacked forms
(:mod:`rayfed.train.stacked`). Nothing in a step reads a value back to the host.

Both paths read a phase alike, through the functions here: its samples (:func:`phase_samples`) and the batches
drawn from them (:func:`phase_batches`), the range of parameters it trains (:func:`trained_range`), its dropout
seed (:func:`phase_seed`) and its trainables' learning rates (:func:`extra_lrs`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch
from torch import nn
from torch.autograd.graph import _engine_run_backward

from rayfed.data.augment import apply_augment
from rayfed.train.batches import ClientBatches, draw_batches, steps_per_epoch
from rayfed.train.dropout import SEEDED_DROPOUT, signed_seed
from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob
from rayfed.train.phase import NO_PARAMETERS, Outputs, Phase
from rayfed.train.rule import PhaseRule
from rayfed.train.settings import TrainConfig
from rayfed.train.workspace import StepInputs, StepState

__all__ = [
    "StepModel",
    "LossRecord",
    "make_step",
    "reads_steps",
    "reads_anchor",
    "unit",
    "backward_from",
    "phase_samples",
    "phase_batches",
    "phase_batching",
    "phase_steps",
    "trained_range",
    "phase_seed",
    "extra_lrs",
]

_UNITS: dict[torch.device, torch.Tensor] = {}


def unit(device: torch.device) -> torch.Tensor:
    """The scalar 1 on ``device``, made once: the gradient a loss's backward starts from (``backward()``
    would make a new one every step)."""
    if device not in _UNITS:
        _UNITS[device] = torch.ones((), device=device)
    return _UNITS[device]


def backward_from(
    loss: torch.Tensor, one: torch.Tensor, inputs: Sequence[torch.Tensor] = ()
) -> tuple[torch.Tensor | None, ...]:
    """``loss.backward(one)`` for a 0-d ``loss`` and its :func:`unit`, calling autograd's engine as
    ``torch.autograd.backward`` does but without that function's check of a given gradient's shape, whose
    first use imports ``torch.fx``'s symbolic shapes and sympy: about 32 MB in every worker process
    (benchmarks/README.md, "Where the S2 peak goes"). With ``inputs``, their gradients are returned as
    ``torch.autograd.grad`` returns them (None for one the loss does not reach) instead of added into their
    ``.grad``."""
    return _engine_run_backward(
        (loss,), (one,), False, False, tuple(inputs), allow_unreachable=True, accumulate_grad=not inputs
    )


def reads_steps(phase: Phase, module: nn.Module) -> bool:
    """Whether anything of ``phase`` reads the step's index (``StepState.step``): its loss (``Batch.step``), or the
    module's dropout masks; else no step counter is kept."""
    return phase.loss is not None or any(isinstance(m, SEEDED_DROPOUT) and m.p > 0 for m in module.modules())


def reads_anchor(phase: Phase) -> bool:
    """Whether ``phase`` has a function that may read ``constants["start"]`` (a loss or a hook); the loop gives the
    round's starting parameters to those phases alone."""
    hooks = (phase.loss, phase.on_train_batch_start, phase.on_after_backward, phase.on_train_end)
    return any(hook is not None for hook in hooks)


def phase_samples(phase: Phase, job: ClientJob) -> tuple[torch.Tensor, torch.Tensor]:
    """The (x, y) samples the client trains on in ``phase``: the phase's ``inputs``, else the client's train split."""
    inputs = phase.samples.inputs
    return inputs if inputs is not None else (job.x_train, job.y_train)


def phase_batches(
    phase: Phase, jobs: Sequence[ClientJob], samples: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> list[ClientBatches]:
    """Each client's batches in ``phase`` (one client's, or a stack's, in the order of ``jobs``) over its
    ``samples``, drawn from its generator with the phase's epochs, batch size, ``drop_last`` and views, else the
    round's (:func:`~rayfed.train.batches.draw_batches`). A client with a step budget (``ClientJob.step_budget``,
    its partial work before a deadline) keeps, in a phase the budget covers (``Phase.budgeted``), the first batches
    within it, which its budget then pays for; every phase counts the steps it keeps in ``ClientJob.trained_steps``."""
    batch, drop_last = phase_batching(phase, jobs[0].train)
    drawn = draw_batches(
        [(job.generator, int(y.shape[0])) for job, (_, y) in zip(jobs, samples)],
        epochs=phase.epochs,
        batch=batch,
        drop_last=drop_last,
        views=phase.samples.views,
        augment=phase.samples.augment,
        image_size=tuple(samples[0][0].shape[1:]),
    )
    kept = [_within_budget(job, phase, batches) for job, batches in zip(jobs, drawn)]
    for job, batches in zip(jobs, kept):
        job.trained_steps += batches.steps
    return kept


def phase_batching(phase: Phase, train: TrainConfig) -> tuple[int, bool]:
    """(samples per step, ``drop_last``) of ``phase``: its own, else the round's."""
    drop_last = train.drop_last if phase.samples.drop_last is None else phase.samples.drop_last
    return phase.samples.batch_size or train.batch_size, drop_last


def phase_steps(phase: Phase, num_train: np.ndarray, train: TrainConfig) -> np.ndarray:
    """The steps ``phase`` draws for clients with ``num_train`` training samples (int64, one per client; over the
    phase's own ``inputs`` where it brings them): its epochs' mini-batches, the work a system model's clock
    charges (docs/system.md)."""
    inputs = phase.samples.inputs
    n = np.asarray(num_train, np.int64) if inputs is None else np.full(len(num_train), int(inputs[1].shape[0]))
    return phase.epochs * steps_per_epoch(n, *phase_batching(phase, train))


def _within_budget(job: ClientJob, phase: Phase, batches: ClientBatches) -> ClientBatches:
    """``batches`` cut to the client's remaining step budget, which they use up, where the budget covers
    ``phase`` (drawn whole first, so the batches the client does take are the ones it takes without a budget)."""
    if job.step_budget is None or phase.budgeted is False:
        return batches
    kept = batches.first(job.step_budget)
    job.step_budget -= kept.steps
    return kept


def trained_range(phase: Phase, flat: FlatModel) -> tuple[int, int]:
    """The range of the parameter vector whose gradients the phase computes: ``Phase.trains``, all of it by
    default, and all of it when the phase trains only its trainables (their gradients come from the model's)."""
    if phase.trains is None or tuple(phase.trains) == NO_PARAMETERS:
        return 0, flat.size
    lo, hi = phase.trains
    return lo, hi


def phase_seed(job: ClientJob, phase_index: int) -> int:
    """The int64 seed of the client's dropout masks in its ``phase_index``-th phase of the round."""
    return signed_seed(job.generator.initial_seed() + 7919 * phase_index)


def extra_lrs(phase: Phase, device: torch.device) -> dict[str, torch.Tensor]:
    """The trainables' own learning rates, as 0-d tensors of their dtypes (those with none use the round's)."""
    return {
        k: torch.full((), float(t.lr), dtype=t.value.dtype, device=device)
        for k, t in phase.extra.items()
        if t.lr is not None
    }


class StepModel(Protocol):
    """How a step sees what it trains: one client's model, or a stack of ``width`` models."""

    width: int
    module: nn.Module

    def plain(self) -> list[torch.Tensor]:
        """Every parameter, to edit under ``no_grad`` (one client's, or (width, *shape) for a stack)."""
        ...

    def begin(self) -> list[torch.Tensor]:
        """Every parameter as the forward reads it; those that train require gradients."""
        ...

    def backward(self, loss: torch.Tensor) -> None:
        """The step's gradients of ``loss`` (0-d) with respect to the parameters that train."""
        ...

    def grads(self) -> list[torch.Tensor | None]:
        """Every parameter's gradient from the step's :meth:`backward`, None where it does not train."""
        ...

    def stepped(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(values, gradients) of the parameters the optimiser steps, as the pieces it updates them in."""
        ...

    def pieces(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """An optimiser buffer of the stepped parameters (laid out as their values, end to end), cut as
        :meth:`stepped` cuts the values."""
        ...

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """The step's inputs as the forward takes them."""
        ...


class LossRecord:
    """The losses a phase reports: summed into ``StepState.loss_sums`` (a replayed step, a stack), or kept step by
    step (one client, eagerly: their mean is taken at the end, as a loop that logs every step's loss would)."""

    def __init__(self, state: StepState) -> None:
        self.state = state
        self.steps: list[torch.Tensor] = []

    def add(self, reported: torch.Tensor) -> None:
        if self.state.loss_sums is not None:
            self.state.loss_sums.add_(reported.detach())
        else:
            self.steps.append(reported)


def make_step(
    model: StepModel,
    rule: PhaseRule,
    state: StepState,
    batch: StepInputs,
    record: LossRecord,
    pixel_scale: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
) -> Callable[[], None]:
    """One step of ``rule``'s phase on ``model`` (module docstring), reading ``batch`` and ``state`` when it
    runs."""
    phase = rule.phase
    width = model.width

    def step() -> None:
        if phase.on_train_batch_start is not None:
            rule.edit_params("on_train_batch_start", model.plain(), state)
        params = model.begin()
        x = batch.x
        assert x is not None and batch.y is not None
        augment = phase.samples.augment
        if augment is not None:
            mean, std = pixel_scale(x)
            draws = batch.draws
            assert draws is not None
            x = torch.cat([apply_augment(x, draws[v], mean, std, augment) for v in range(phase.samples.views)])
        x = model.inputs(x)
        outputs = phase.forward(model.module, x) if phase.forward is not None else Outputs(model.module(x), None)
        ce = rule.cross_entropy(outputs.logits, batch.y, batch.weight, width) if phase.cross_entropy else None
        term = None
        if phase.loss is not None:
            assert state.step is not None  # a phase with a loss counts its steps (reads_steps)
            term = rule.term(outputs, batch.y, batch.weight, state.step, params, state.constants, width)
        total = _total(ce, term)
        model.backward(total)
        extra_grads = rule.edit_grads(params, model.grads(), state) if phase.on_after_backward is not None else {}
        with torch.no_grad():
            if rule.steps_parameters:
                values, grads = model.stepped()
                rule.update(values, grads, state.optimizer, state.lr, batch.adam, model.pieces)
            rule.update_extra(state, extra_grads, batch.adam)
            if state.step is not None:
                state.step.add_(1)
        reported = ce if ce is not None else term
        assert reported is not None
        record.add(reported)

    return step


def _total(ce: torch.Tensor | None, term: torch.Tensor | None) -> torch.Tensor:
    """The loss backward starts from: the clients' cross-entropies and terms, summed over a stack."""
    parts = [p if p.dim() == 0 else p.sum() for p in (ce, term) if p is not None]
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]
