"""The one local-training loop: every method's phases, one client at a time or many clients stacked.

A worker hands :meth:`LocalLoop.train_one` / :meth:`LocalLoop.train_stack` clients of one architecture, their
starting models and each client's phases (:class:`~rayfed.train.phase.Phase`, what its client half declares). The
loop keeps the models the phases train (the round's model and the models clients keep in their state, Ditto's
personal one), loads each phase's starting values and momentum buffers, gives every phase the round's starting
parameters as ``constants["start"]``, and runs the phase on
:class:`~rayfed.train.sequential.SequentialTraining` or, for a stack,
:class:`~rayfed.train.stacked.StackedTraining`; both run the one step (:mod:`rayfed.train.step`) and replay it
from CUDA graphs where the worker's :class:`~rayfed.train.graphs.StepGraphs` capture. A phase that trains only
the output layer of a model that maps each sample alike at every step trains on features computed once.

What the phases leave goes back to the clients, on the device (the worker reads a call's values back once):
the round's trained models (returned), the kept models and momentum buffers (into ``job.state``), the
trainables' final values (into ``job.extra``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rayfed.data.augment import pixel_scale
from rayfed.train.evaluate import features_before_output
from rayfed.train.flat import FlatModel
from rayfed.train.graphs import StepGraphs
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob
from rayfed.train.phase import SGD, Forward, Outputs, Phase
from rayfed.train.sequential import SequentialTraining
from rayfed.train.stack_layout import logical_rows
from rayfed.train.stacked import StackedTraining
from rayfed.train.step import phase_samples, reads_anchor, trained_range

__all__ = ["Trained", "LocalLoop"]


@dataclass(frozen=True)
class Trained:
    """What the loop returns of clients trained together, in the order of their jobs."""

    states: torch.Tensor
    """(C, S) the round's trained models: parameters, then floating-point buffers."""
    losses: Any
    """The mean reported loss of each client: a (C,) tensor, or one 0-d tensor (or NaN) per client."""
    steps: list[int]
    """Each client's reported steps."""


class LocalLoop:
    """A worker's local training (module docstring). ``mean`` and ``std`` are the dataset's normalisation,
    which augmented views undo and redo; ``output_layers`` each architecture's output layer; ``method`` names
    the algorithm in errors."""

    def __init__(
        self,
        graphs: StepGraphs,
        mean: Sequence[float],
        std: Sequence[float],
        output_layers: Mapping[str, str] | None = None,
        method: str = "",
    ) -> None:
        self.graphs = graphs
        self.output_layers = dict(output_layers or {})
        self.method = method
        self._scales: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self._mean, self._std = tuple(mean), tuple(std)
        self.sequential = SequentialTraining(graphs, self.pixel_scale)
        self._stacked: dict[int, StackedTraining] = {}

    def pixel_scale(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalisation as (1, C, 1, 1) tensors on ``like``'s device, made once (a captured step reads them)."""
        key = (like.device, like.dtype)
        if key not in self._scales:
            self._scales[key] = pixel_scale(self._mean, self._std, like)
        return self._scales[key]

    def _where(self, client: int | str, index: int, count: int) -> str:
        return f"algorithm {self.method!r}, client {client}, phase {index} of {count}"

    def train_one(self, job: ClientJob, phases: Sequence[Phase], *, replays: bool = True) -> tuple[Any, int]:
        """Train the client's model in ``job.flat`` through its ``phases``, in place from the model it holds (its
        start); returns its mean reported loss (a 0-d tensor, NaN without a step) and its steps."""
        flat = job.flat
        own = list(phases)
        if any(reads_anchor(p) for p in own):
            own = _anchored(own, torch.cat([p.detach().reshape(-1) for p in flat.params]))
        current: Any = None  # the key of the model now in ``flat``: None = the round's
        models: dict[Any, torch.Tensor] = {}
        reported: list[torch.Tensor] = []
        summed, count = False, 0
        extra: dict[str, torch.Tensor] = {}
        kept: dict[str, torch.Tensor] = {}
        for index, phase in enumerate(own):
            key = None if phase.model is None else phase.model.key
            if key != current:
                models[current] = flat.state()
                flat.load_state(models[key] if key in models else _kept_model(job, phase, flat, models[None]))
                current = key
            phase = self._reading_features(self._on_features(phase, job, flat), job.architecture)
            where = self._where(job.client_id, index, len(own))
            outcome = self.sequential.run(job, phase, index, _kept_momentum(job, phase, flat), replays, where)
            extra.update(outcome.extra)
            if _keeps_momentum(phase, job) and outcome.momentum is not None:
                kept[phase.optimizer.keep_momentum] = outcome.momentum  # type: ignore[union-attr,index]
            if phase.reports:
                reported.extend(outcome.losses)
                summed, count = summed or outcome.summed, count + outcome.steps
        if current is not None:
            models[current] = flat.state()
            flat.load_state(models[None])
        kept.update((key, value) for key, value in models.items() if key is not None)
        job.extra = extra
        _keep(job, kept)
        if not count:
            return math.nan, 0
        with torch.no_grad():
            return (torch.stack(reported).sum() / count if summed else torch.stack(reported).mean()), count

    def train_stack(
        self,
        jobs: Sequence[ClientJob],
        starts: torch.Tensor,
        phases: Sequence[Sequence[Phase]],
        *,
        replays: bool = True,
        pack: bool = False,
    ) -> Trained:
        """Train ``jobs`` (clients of one architecture, sharing ``jobs[0].flat``, their phases stacking together) as
        one stack from ``starts`` (C, S), its clients packed into lanes where ``pack``
        (:func:`~rayfed.train.lanes.packed_lanes`)."""
        flat = jobs[0].flat
        own = [list(p) for p in phases]
        if any(reads_anchor(p) for p in own[0]):
            own = [_anchored(p, anchor) for p, anchor in zip(own, logical_rows(starts, flat.layout))]
        runner = self._stacked.setdefault(id(flat), StackedTraining(flat, self.graphs, self.pixel_scale))
        models: dict[Any, torch.Tensor] = {None: starts}
        loss_sums = torch.zeros(len(jobs), device=starts.device)
        steps = [0] * len(jobs)
        kept: list[dict[str, torch.Tensor]] = [{} for _ in jobs]
        extra: list[dict[str, torch.Tensor]] = [{} for _ in jobs]
        count = len(own[0])
        for index in range(count):
            column = [p[index] for p in own]
            phase = column[0]
            key = None if phase.model is None else phase.model.key
            if key not in models:
                models[key] = torch.stack(
                    [_kept_model(job, p, flat, start) for job, p, start in zip(jobs, column, starts)]
                )
            momentum = None
            if _keeps_momentum(phase, jobs[0]):
                lo, hi = trained_range(phase, flat)
                buffers = [_kept_momentum(job, phase, flat) for job in jobs]
                momentum = torch.stack(
                    [b if b is not None else torch.zeros(hi - lo, device=starts.device) for b in buffers]
                )
            if self._features_layer(phase, flat, jobs[0].architecture) is not None:
                for c, job in enumerate(jobs):
                    flat.load_state(models[key][c])
                    column[c] = self._on_features(column[c], job, flat)
            column = [self._reading_features(p, jobs[0].architecture) for p in column]
            where = self._where("stack of " + ",".join(str(j.client_id) for j in jobs[:8]), index, count)
            outcome = runner.run(jobs, column, index, models[key], momentum, replays, where, pack)
            models[key] = outcome.trained
            for c in range(len(jobs)):
                extra[c].update({k: v[c] for k, v in outcome.extra.items()})
                if _keeps_momentum(phase, jobs[0]) and outcome.momentum is not None:
                    kept[c][phase.optimizer.keep_momentum] = outcome.momentum[c]  # type: ignore[union-attr,index]
            if phase.reports:
                loss_sums = loss_sums + outcome.loss_sums
                steps = [a + b for a, b in zip(steps, outcome.steps)]
        for c, job in enumerate(jobs):
            kept[c].update((key, rows[c]) for key, rows in models.items() if key is not None)
            job.extra = extra[c]
            _keep(job, kept[c])
        counts = torch.tensor([max(n, 1) for n in steps], dtype=torch.float32)
        return Trained(models[None], loss_sums / to_device([counts], starts.device)[0], steps)

    # --- a phase on features computed once ------------------------------------------------------------
    def _features_layer(self, phase: Phase, flat: FlatModel, architecture: str) -> str | None:
        """The output layer, when ``phase`` trains it alone, on the model's own forward of its own samples, and the
        layers before it map each sample alike at every step (no BatchNorm, no active dropout)."""
        name = self.output_layers.get(architecture)
        samples = phase.samples
        if name is None or phase.trains is None or phase.forward is not None or samples.augment is not None:
            return None
        if samples.views != 1 or phase.load is not None:
            return None
        layer = flat.module.get_submodule(name)
        part = flat.slice_of(name)
        if not isinstance(layer, nn.Linear) or tuple(phase.trains) != (part.start, part.stop):
            return None
        if part.stop != flat.size or not _same_in_training(flat.module):
            return None
        return name

    def _on_features(self, phase: Phase, job: ClientJob, flat: FlatModel) -> Phase:
        """``phase`` on the features its output layer reads, computed now from the model in ``flat``, where it
        trains that layer alone (:meth:`_features_layer`); else ``phase`` itself."""
        name = self._features_layer(phase, flat, job.architecture)
        if name is None:
            return phase
        x, y = phase_samples(phase, job)
        if len(y):
            features = torch.cat([f for _, f in features_before_output(flat.module, name, x)])
        else:
            layer = flat.module.get_submodule(name)
            assert isinstance(layer, nn.Linear)
            features = x.new_empty(0, layer.in_features)
        samples = dataclasses.replace(phase.samples, inputs=(features, y))
        return dataclasses.replace(phase, samples=samples, forward=_layer_forward(name))

    def _reading_features(self, phase: Phase, architecture: str) -> Phase:
        """``phase``, whose loss reads the input of the model's output layer as ``Outputs.features`` where it has a
        loss and the module's own forward."""
        name = self.output_layers.get(architecture)
        if phase.loss is None or phase.forward is not None or name is None:
            return phase
        return dataclasses.replace(phase, forward=_with_features(name))


def _anchored(phases: list[Phase], anchor: torch.Tensor) -> list[Phase]:
    """``phases`` with ``constants["start"]`` where they may read it (:func:`~rayfed.train.step.reads_anchor`): the
    round's starting parameters in logical order."""
    return [
        dataclasses.replace(p, constants={**p.constants, "start": anchor}) if reads_anchor(p) else p for p in phases
    ]


def _same_in_training(model: nn.Module) -> bool:
    """Whether ``model`` maps each sample alike in training mode whatever else is in its batch, at every call:
    no BatchNorm (batch statistics, running buffers), no dropout with p > 0."""
    return not any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) or (isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0)
        for m in model.modules()
    )


@functools.cache
def _layer_forward(name: str) -> Forward:
    """The forward of a model's layer ``name`` alone, on the features it reads (one function per name, so phases
    using it stack)."""

    def forward(module: torch.nn.Module, x: torch.Tensor) -> Outputs:
        return Outputs(module.get_submodule(name)(x), x)

    return forward


@functools.cache
def _with_features(name: str) -> Forward:
    """The model's forward, with the input of its layer ``name`` (the output layer) as ``Outputs.features`` (one
    function per name, so phases using it stack)."""

    def forward(module: torch.nn.Module, x: torch.Tensor) -> Outputs:
        read: list[torch.Tensor] = []
        hook = module.get_submodule(name).register_forward_pre_hook(lambda _layer, args: read.append(args[0]))
        try:
            logits = module(x)
        finally:
            hook.remove()
        return Outputs(logits, read[-1])

    return forward


def _kept_model(job: ClientJob, phase: Phase, flat: FlatModel, round_start: torch.Tensor) -> torch.Tensor:
    """The kept model ``phase.model`` of the client, on the device: the one in its state, else the phase's
    ``initial``, else (none given) a copy of the round's starting model ``round_start``."""
    assert phase.model is not None
    saved = (job.state or {}).get(phase.model.key)
    value = saved if saved is not None and tuple(saved.shape) == (flat.state_size,) else phase.model.initial
    if value is None:
        return round_start.clone()
    return value if isinstance(value, torch.Tensor) else to_device([np.asarray(value, np.float32)], job.device)[0]


def _keeps_momentum(phase: Phase, job: ClientJob) -> bool:
    """Whether ``phase`` keeps a momentum buffer in the client's state: ``SGD.keep_momentum``, with momentum."""
    optimizer = phase.optimizer
    if not isinstance(optimizer, SGD) or not optimizer.keep_momentum:
        return False
    return bool(job.train.momentum if optimizer.momentum is None else optimizer.momentum)


def _kept_momentum(job: ClientJob, phase: Phase, flat: FlatModel) -> torch.Tensor | None:
    """The momentum buffer the client kept for ``phase`` (``SGD.keep_momentum``), on the device; None for none."""
    if not _keeps_momentum(phase, job):
        return None
    assert isinstance(phase.optimizer, SGD) and phase.optimizer.keep_momentum
    lo, hi = trained_range(phase, flat)
    saved = (job.state or {}).get(phase.optimizer.keep_momentum)
    if saved is None or tuple(saved.shape) != (hi - lo,):
        return None
    if isinstance(saved, torch.Tensor):
        return saved
    return to_device([np.asarray(saved, dtype=np.float32)], job.device)[0]


def _keep(job: ClientJob, kept: Mapping[str, torch.Tensor]) -> None:
    """Store the kept models and momentum buffers in the client's state, on the device (the settlement reads the
    call's states back with its numbers)."""
    if kept:
        job.state = {**(job.state or {}), **kept}
