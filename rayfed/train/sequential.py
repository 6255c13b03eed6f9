"""One client's phase, step by step, on the worker's model of its architecture.

The client's batches are drawn on the host (:func:`~rayfed.train.step.phase_batches`) and reach the
device in one transfer; its samples are gathered there one block of equal-size steps at a time. The step
is :func:`~rayfed.train.step.make_step` on the worker's model itself (:class:`OneModel`): eagerly, the step's
values are views rebound at every step and the losses are kept per step; on a GPU that captures, they are
copied into fixed storage, and the step is captured once per model, phase and batch shape and replayed
(:class:`~rayfed.train.graphs.StepGraphs`), its losses summed in the graph. Nothing in the step loop reads a
value back to the host.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from rayfed.train.batches import ClientBatches
from rayfed.train.dropout import client_dropout
from rayfed.train.flat import FlatModel
from rayfed.train.graphs import StepGraphs
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.phase import Adam, Phase
from rayfed.train.rule import PhaseRule
from rayfed.train.stack_layout import sub_layout
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
from rayfed.train.workspace import StepInputs, StepState

__all__ = ["PhaseOutcome", "SequentialTraining", "OneModel", "frozen_outside"]


@contextmanager
def frozen_outside(flat: FlatModel, lo: int, hi: int) -> Iterator[None]:
    """Parameters outside [lo, hi) stop requiring gradients while the block runs, so backward skips them (and
    the layers below them when nothing there trains): FedRep's head epochs cost a forward, not a backward."""
    offsets = flat.layout.offsets
    frozen = [p for i, p in enumerate(flat.params) if p.requires_grad and (offsets[i + 1] <= lo or offsets[i] >= hi)]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


class OneModel:
    """A step's view of one client's model: the worker's model itself (:class:`~rayfed.train.step.StepModel`).

    Backward hands over each trained parameter's gradient as it makes it, and the optimiser updates the parameter
    from it tensor by tensor: no gradient is added into a buffer that must be zeroed first, two passes over the
    model a step that a CPU feels (benchmarks/README.md, "Throughput")."""

    width = 1

    def __init__(self, flat: FlatModel, trained: tuple[int, int]) -> None:
        self.flat, self.module = flat, flat.module
        lo, hi = trained
        self._layout = sub_layout(flat.layout, lo, hi)
        self._first = flat.layout.offsets.index(lo)
        self._trained: list[torch.Tensor] = list(flat.params[self._first : self._first + len(self._layout.names)])
        self._grads: list[torch.Tensor] = []

    def plain(self) -> list[torch.Tensor]:
        return list(self.flat.params)

    def begin(self) -> list[torch.Tensor]:
        return list(self.flat.params)

    def backward(self, loss: torch.Tensor) -> None:
        made = backward_from(loss, unit(loss.device), self._trained)
        self._grads = [torch.zeros_like(p) if g is None else g for p, g in zip(self._trained, made)]

    def grads(self) -> list[torch.Tensor | None]:
        grads: list[torch.Tensor | None] = [None] * len(self.flat.params)
        grads[self._first : self._first + len(self._grads)] = self._grads
        return grads

    def stepped(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return self._trained, self._grads

    def pieces(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        return self._layout.views(buffer)

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        return x


@dataclass
class PhaseOutcome:
    """What one client's phase leaves besides its trained model."""

    losses: list[torch.Tensor]
    """Each step's reported loss (eagerly), or one sum of them (replayed: ``summed``)."""
    steps: int
    summed: bool
    extra: dict[str, torch.Tensor]
    """The trainables' final values."""
    momentum: torch.Tensor | None
    """The momentum buffer of the trained range, for ``SGD.keep_momentum``."""


class SequentialTraining:
    """Phases of one client at a time on a worker's models (module docstring)."""

    def __init__(
        self, graphs: StepGraphs, pixel_scale: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        self.graphs = graphs
        self.pixel_scale = pixel_scale
        self._held: dict[Hashable, tuple[StepState, dict[int, StepInputs]]] = {}
        self._lrs: dict[tuple[torch.device, float], torch.Tensor] = {}

    def run(
        self,
        job: ClientJob,
        phase: Phase,
        phase_index: int,
        momentum: torch.Tensor | None,
        replays: bool,
        where: str,
    ) -> PhaseOutcome:
        """Train ``job.flat`` through ``phase`` in place from the model it holds; ``momentum`` (the trained range's
        buffer, kept from the client's last round) or None starts from zero; ``replays`` allows CUDA graphs;
        ``where`` names the phase in errors."""
        flat = job.flat
        x_all, y_all = samples = phase_samples(phase, job)
        (batches,) = phase_batches(phase, [job], [samples])
        trained = trained_range(phase, flat)
        rule = PhaseRule(phase, job.train, stacked=False, where=where, shapes=flat.layout.shapes)
        if phase.load is not None:
            (start, stop), values = phase.load
            with torch.no_grad():
                flat.vector[start:stop].copy_(values)
        static = replays and self.graphs.fixed
        new = self._start(job, phase, phase_index, rule, trained, static)
        if momentum is not None and new.optimizer.momentum is not None:
            new.optimizer.momentum.copy_(momentum)
        if not batches.steps:
            return PhaseOutcome([], 0, False, new.extra, new.optimizer.momentum)
        key = (id(flat), stack_key(phase), batches.index.shape[1], tuple(x_all.shape[1:]), y_all.dtype)
        state, feeds = new, dict[int, StepInputs]()
        if static:  # a captured step reads the storage it was captured on: this key's, filled anew
            if key in self._held:
                state, feeds = self._held[key]
                state.refill(new)
            else:
                state = new.copy()
                self._held[key] = (state, feeds)
        record = self._steps(job, rule, state, feeds if static else None, batches, samples, trained, key)
        extra, momentum = state.extra, state.optimizer.momentum
        losses = record.steps
        if static:  # the workspace serves the next client: keep copies
            assert state.loss_sums is not None
            losses = [state.loss_sums.clone()]
            extra = {k: v.clone() for k, v in extra.items()}
            momentum = None if momentum is None else momentum.clone()
        return PhaseOutcome(losses, batches.steps, static, extra, momentum)

    def _start(
        self, job: ClientJob, phase: Phase, phase_index: int, rule: PhaseRule, trained: tuple[int, int], static: bool
    ) -> StepState:
        """What the phase's first step starts from: the trained range of ``job.flat``, zero optimiser buffers, the
        round's learning rate, the client's dropout seed (where the model drops out), the phase's constants and
        trainables; a loss sum to add to when the step is replayed (``static``)."""
        flat, device = job.flat, job.device
        dropout_layers = any(True for _ in _dropouts(flat.module))
        return StepState.new(
            phase,
            _part(flat.vector, *trained),
            rule.momentum,
            counts_steps=reads_steps(phase, flat.module),
            lr=self._lr(job.lr, device),
            seeds=torch.full((1,), phase_seed(job, phase_index), dtype=torch.int64, device=device)
            if dropout_layers
            else None,
            constants=dict(phase.constants),
            extra={k: t.value.clone() for k, t in phase.extra.items()},
            extra_lr=extra_lrs(phase, device),
            loss_sums=torch.zeros((), device=device) if static else None,
        )

    def _steps(
        self,
        job: ClientJob,
        rule: PhaseRule,
        state: StepState,
        feeds: dict[int, StepInputs] | None,
        batches: ClientBatches,
        samples: tuple[torch.Tensor, torch.Tensor],
        trained: tuple[int, int],
        key: tuple[Hashable, ...],
    ) -> LossRecord:
        """Run the phase's steps on ``job.flat``, then its ``on_train_end``; returns the losses they report. With
        ``feeds`` (a replayed step's fixed inputs, one per batch size) each step is captured once under ``key`` and
        its size, and replayed; without, it runs eagerly."""
        flat, phase = job.flat, rule.phase
        x_all, y_all = samples
        moved = self._move(batches, phase, job)
        record = LossRecord(state)
        model = OneModel(flat, trained)
        flat.module.train()
        with (
            frozen_outside(flat, *trained),
            client_dropout(flat.module) as dropout,
        ):
            dropout.update(
                seeds=state.seeds,
                width=1,
                step=state.step,
                views=phase.samples.views,
                batch=int(batches.index.shape[1]),
            )
            mutable = [flat.vector, flat.buffers, *state.mutable()]
            index, draws = moved["index"], moved.get("draws")
            for first, stop in _blocks(batches):
                size = int(batches.sizes[first])
                # A batch of another size reads its own fixed inputs (and has its own captured step).
                feed = feeds.setdefault(size, StepInputs()) if feeds is not None else StepInputs()
                step = make_step(model, rule, state, feed, record, self.pixel_scale)
                rows = index[first:stop, :size]
                xs, ys = x_all[rows], y_all[rows]  # one gather per block of equal-size steps
                for s in range(stop - first):
                    feed.fill(
                        feeds is not None,
                        x=xs[s],
                        y=ys[s],
                        draws=None if draws is None else draws[first + s, :, :size],
                        adam=moved["adam"][first + s] if isinstance(phase.optimizer, Adam) else None,
                    )
                    self.graphs.run((*key, size) if feeds is not None else None, step, mutable)
            rule.edit_params("on_train_end", flat.params, state)
        return record

    def _lr(self, lr: float, device: torch.device) -> torch.Tensor:
        """The learning rate as a 0-d tensor on ``device``, made once per value (the clients of a round share it)."""
        key = (device, lr)
        if key not in self._lrs:
            self._lrs = {key: torch.full((), lr, device=device)}  # one round's value kept
        return self._lrs[key]

    def _move(self, batches: ClientBatches, phase: Phase, job: ClientJob) -> dict[str, torch.Tensor]:
        """The phase's batch indices, view draws and Adam scalars on the device, in one transfer."""
        names, arrays = ["index"], [batches.index]
        if batches.draws is not None:
            names.append("draws")
            arrays.append(batches.draws)
        if isinstance(phase.optimizer, Adam):
            names.append("adam")
            arrays.append(adam_scalars(job.lr, phase.optimizer.betas, batches.steps))
        return dict(zip(names, to_device(arrays, job.device)))


def _part(vector: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """``vector[lo:hi]``, the vector itself when that is all of it."""
    return vector if (lo, hi) == (0, vector.numel()) else vector[lo:hi]


def _blocks(batches: ClientBatches) -> Iterator[tuple[int, int]]:
    """Runs of consecutive steps of one batch size, as (first step, stop)."""
    sizes = batches.sizes.tolist()
    first = 0
    for s in range(1, len(sizes) + 1):
        if s == len(sizes) or sizes[s] != sizes[first]:
            yield first, s
            first = s


def _dropouts(module: nn.Module) -> Iterator[nn.Module]:
    return (m for m in module.modules() if isinstance(m, (nn.Dropout, nn.Dropout2d)) and m.p > 0)
