"""One client's phase, step by step, on the worker's model of its architecture.

The client's batches are drawn on the host (:func:`~rayfed.train.batches.draw_batches`) and reach the
device in one transfer; its samples are gathered there one block of equal-size steps at a time. A step
is one function (:class:`PhaseRule` does its arithmetic) that reads its batch, constants and carry from
a :class:`~rayfed.train.step_io.StepIO`: eagerly, the step's values are views rebound at every step and
the losses are kept per step; on a GPU that captures, they are copied into fixed storage, and the step
is captured once per model, phase and batch shape and replayed (:class:`~rayfed.train.graphs.StepGraphs`),
its losses summed in the graph. Nothing in the step loop reads a value back to the host.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.graph import _engine_run_backward

from rayfed.data.augment import apply_augment
from rayfed.train.batches import ClientBatches, draw_batches
from rayfed.train.dropout import client_dropout, signed_seed
from rayfed.train.flat import FlatModel
from rayfed.train.graphs import StepGraphs
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.phase import Adam, Outputs, Phase
from rayfed.train.rule import CARRY, CONSTANTS, PhaseRule
from rayfed.train.step_io import StepIO
from rayfed.train.update import adam_scalars

__all__ = [
    "PhaseOutcome",
    "SequentialTraining",
    "phase_seed",
    "trained_range",
    "frozen_outside",
    "captured_features",
    "unit",
    "backward_from",
]

_UNITS: dict[torch.device, torch.Tensor] = {}


def unit(device: torch.device) -> torch.Tensor:
    """The scalar 1 on ``device``, made once: the gradient a loss's backward starts from (``backward()``
    would make a new one every step)."""
    if device not in _UNITS:
        _UNITS[device] = torch.ones((), device=device)
    return _UNITS[device]


def backward_from(loss: torch.Tensor, one: torch.Tensor) -> None:
    """``loss.backward(one)`` for a 0-d ``loss`` and its :func:`unit`, calling autograd's engine as
    ``torch.autograd.backward`` does but without that function's check of a given gradient's shape, whose
    first use imports ``torch.fx``'s symbolic shapes and sympy: about 32 MB in every worker process
    (benchmarks/README.md, "Where the S2 peak goes")."""
    _engine_run_backward((loss,), (one,), False, False, (), allow_unreachable=True, accumulate_grad=True)


def phase_seed(job: ClientJob, phase_index: int) -> int:
    """The int64 seed of the client's dropout masks in its ``phase_index``-th phase of the round."""
    return signed_seed(job.generator.initial_seed() + 7919 * phase_index)


def trained_range(phase: Phase, flat: FlatModel) -> tuple[int, int]:
    """The phase's trained range of the parameter vector (all of it by default), on parameter boundaries."""
    if phase.trains is None:
        return 0, flat.size
    lo, hi = phase.trains
    if lo not in flat.layout.offsets or hi not in flat.layout.offsets or not lo < hi:
        raise ValueError(
            f"Phase.trains={phase.trains} must be a non-empty range on parameter boundaries {flat.layout.offsets}"
        )
    return lo, hi


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


@contextmanager
def captured_features(module: nn.Module, name: str | None) -> Iterator[list[torch.Tensor]]:
    """While the block runs, every forward appends the input of ``module``'s submodule ``name`` to the list
    yielded (nothing without a name)."""
    captured: list[torch.Tensor] = []
    if name is None:
        yield captured
        return
    hook = module.get_submodule(name).register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    try:
        yield captured
    finally:
        hook.remove()


@dataclass
class PhaseOutcome:
    """What one client's phase leaves besides its trained model."""

    losses: list[torch.Tensor]
    """Each step's reported loss (eagerly), or one sum of them (replayed: ``summed``)."""
    steps: int
    summed: bool
    carry: dict[str, torch.Tensor]
    momentum: torch.Tensor | None
    """The momentum buffer of the trained range, for ``SGD.keep_momentum``."""


class SequentialTraining:
    """Phases of one client at a time on a worker's models (module docstring)."""

    def __init__(
        self, graphs: StepGraphs, pixel_scale: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        self.graphs = graphs
        self.pixel_scale = pixel_scale
        self._spaces: dict[Hashable, StepIO] = {}
        self._lrs: dict[tuple[torch.device, float], torch.Tensor] = {}

    def run(
        self, job: ClientJob, phase: Phase, phase_index: int, momentum: torch.Tensor | None, replays: bool
    ) -> PhaseOutcome:
        """Train ``job.flat`` through ``phase`` in place from the model it holds; ``momentum`` (the trained range's
        buffer, kept from the client's last round) or None starts from zero; ``replays`` allows CUDA graphs."""
        flat, device = job.flat, job.device
        x_all, y_all = phase.inputs if phase.inputs is not None else (job.x_train, job.y_train)
        train = job.train
        (batches,) = draw_batches(
            [(job.generator, int(y_all.shape[0]))],
            epochs=phase.epochs,
            batch=phase.batch_size or train.batch_size,
            drop_last=train.drop_last if phase.drop_last is None else phase.drop_last,
            views=phase.views,
            augment=phase.augment,
            image_size=tuple(x_all.shape[1:]),
        )
        lo, hi = trained_range(phase, flat)
        rule = PhaseRule(phase, train, stacked=False)
        if phase.load is not None:
            (start, stop), values = phase.load
            with torch.no_grad():
                flat.vector[start:stop].copy_(values)
        state = rule.optimizer_state(_part(flat.vector, lo, hi))
        if momentum is not None and "momentum" in state:
            state["momentum"].copy_(momentum)
        if not batches.steps:
            return PhaseOutcome([], 0, False, dict(phase.carry), state.get("momentum"))
        moved = self._move(batches, phase, job)
        static = replays and self.graphs.fixed
        key = (id(flat), phase.signature(), batches.index.shape[1], tuple(x_all.shape[1:]), y_all.dtype)
        io = self._spaces.setdefault(key, StepIO(True)) if static else StepIO(False)
        io.put("lr", self._lr(job.lr, device))
        io.put_all(CONSTANTS, dict(phase.constants))
        io.put_all(CARRY, {k: v.clone() for k, v in phase.carry.items()})
        io.put_all("opt.", state)
        dropout_layers = any(True for _ in _dropouts(flat.module))
        counted = phase.loss is not None or dropout_layers
        io.put("step", torch.zeros((), dtype=torch.int64, device=device) if counted else None)
        seed = phase_seed(job, phase_index)
        io.put("seeds", torch.full((1,), seed, dtype=torch.int64, device=device) if dropout_layers else None)
        io.put("loss_sum", torch.zeros((), device=device) if static else None)
        losses: list[torch.Tensor] = []
        flat.module.train()
        with (
            frozen_outside(flat, lo, hi),
            captured_features(flat.module, phase.features) as captured,
            client_dropout(flat.module) as dropout,
        ):
            dropout.update(
                seeds=io["seeds"], width=1, step=io["step"], views=phase.views, batch=int(batches.index.shape[1])
            )
            mutable = [
                flat.vector,
                flat.buffers,
                *io.tensors("opt."),
                *io.tensors(CARRY),
                *([io["step"]] if counted else []),
                *([io["loss_sum"]] if static else []),
            ]
            index, draws = moved["index"], moved.get("draws")
            for first, stop in _blocks(batches):
                size = int(batches.sizes[first])
                # A batch of another size reads its own fixed inputs (and has its own captured step).
                feed = self._spaces.setdefault((*key, size), StepIO(True)) if static else io
                step = self._step(flat, rule, io, feed, (lo, hi), captured, losses, phase.views)
                rows = index[first:stop, :size]
                xs, ys = x_all[rows], y_all[rows]  # one gather per block of equal-size steps
                for s in range(stop - first):
                    feed.put("x", xs[s])
                    feed.put("y", ys[s])
                    if draws is not None:
                        feed.put("draws", draws[first + s, :, :size])
                    if isinstance(phase.optimizer, Adam):
                        feed.put("adam", moved["adam"][first + s])
                    self.graphs.run((*key, size) if static else None, step, mutable)
            rule.edit_params("on_train_end", flat.params, io)
        carry, momentum = io.group(CARRY), io.get("opt.momentum")
        if static:  # the workspace serves the next client: keep copies
            losses = [io["loss_sum"].clone()]
            carry = {k: v.clone() for k, v in carry.items()}
            momentum = None if momentum is None else momentum.clone()
        return PhaseOutcome(losses, batches.steps, static, carry, momentum)

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

    def _step(
        self,
        flat: FlatModel,
        rule: PhaseRule,
        io: StepIO,
        feed: StepIO,
        trained: tuple[int, int],
        captured: list[torch.Tensor],
        losses: list[torch.Tensor],
        views: int,
    ) -> Callable[[], None]:
        """One step of ``rule``'s phase on ``flat``, reading its batch from ``feed`` and the rest from ``io``."""
        phase, module, params = rule.phase, flat.module, flat.params
        grads = [p.grad for p in params]
        vector, grad = _part(flat.vector, *trained), _part(flat.grad, *trained)
        state = io.group("opt.")
        one = unit(vector.device)

        def step() -> None:
            flat.zero_grad()
            rule.edit_params("on_train_batch_start", params, io)
            x = feed["x"]
            if phase.augment is not None:
                mean, std = self.pixel_scale(x)
                x = torch.cat([apply_augment(x, feed["draws"][v], mean, std, phase.augment) for v in range(views)])
            outputs = phase.forward(module, x) if phase.forward is not None else Outputs(module(x), None)
            if phase.features is not None and phase.forward is None:
                outputs = Outputs(outputs.logits, captured.pop())
            y = feed["y"]
            ce = rule.cross_entropy(outputs.logits, y, None, 1) if phase.cross_entropy else None
            total = ce
            if phase.loss is not None:
                term = rule.term(outputs, y, None, io["step"], params, io.group(CONSTANTS), 1)
                total = term if total is None else total + term
            assert total is not None
            backward_from(total, one)
            rule.edit_grads(params, grads, io)
            rule.update(vector, grad, state, io["lr"], feed.get("adam"))
            rule.edit_params("on_after_optimizer_step", params, io)
            if io.get("step") is not None:
                io["step"].add_(1)
            reported = ce if ce is not None else total
            if io.get("loss_sum") is not None:
                io["loss_sum"].add_(reported.detach())
            else:
                losses.append(reported)

        return step


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
