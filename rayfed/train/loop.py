"""The one local-training loop: every method's phases, one client at a time or many clients stacked.

A worker hands :meth:`LocalLoop.train` clients of one architecture, their starting models and each
client's phases (:class:`~rayfed.train.phase.Phase`, what its client half declares). The loop keeps the
models the phases train (the round's model and the models clients keep in their state, Ditto's personal
one), loads each phase's starting values and momentum buffers, and runs the phase on
:class:`~rayfed.train.sequential.SequentialTraining` or, for a stack,
:class:`~rayfed.train.stacked.StackedTraining`; both step through the same
:class:`~rayfed.train.rule.PhaseRule` and the same updates (:mod:`rayfed.train.update`), and both replay
their steps from CUDA graphs where the worker's :class:`~rayfed.train.graphs.StepGraphs` capture.

What the phases leave goes back to the clients: the round's trained models (returned), the kept models
and momentum buffers (into ``job.state``, brought to the host in one transfer), each phase's final carry
(into ``job.scratch`` under :data:`FINAL_CARRY`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rayfed.data.augment import pixel_scale
from rayfed.train.evaluate import features_before_output
from rayfed.train.flat import FlatModel
from rayfed.train.graphs import StepGraphs
from rayfed.train.host import to_device, to_host
from rayfed.train.job import ClientJob
from rayfed.train.phase import SGD, Forward, Outputs, Phase
from rayfed.train.scratch import ScratchKey
from rayfed.train.sequential import SequentialTraining, trained_range
from rayfed.train.stack_plan import logical_rows
from rayfed.train.stacked import StackedTraining

__all__ = ["FINAL_CARRY", "Trained", "LocalLoop"]

FINAL_CARRY = ScratchKey[dict[int, dict[str, torch.Tensor]]]("train.final_carry")
"""``job.scratch`` key: each phase's carry when it ended (tensors on the job's device), by the phase's index."""


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
    which augmented views undo and redo."""

    def __init__(self, graphs: StepGraphs, mean: Sequence[float], std: Sequence[float]) -> None:
        self.graphs = graphs
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

    def train_one(self, job: ClientJob, phases: Sequence[Phase], *, replays: bool = True) -> tuple[Any, int]:
        """Train the client's model in ``job.flat`` through its ``phases``, in place from the model it holds (its
        personalised start); returns its mean reported loss (a 0-d tensor, NaN without a step) and its steps."""
        flat = job.flat
        own = self._anchored(list(phases), flat, None)
        current: str | None = None  # the model now in ``flat``
        models: dict[str | None, torch.Tensor] = {}
        reported: list[torch.Tensor] = []
        summed, count = False, 0
        carries: dict[int, dict[str, torch.Tensor]] = {}
        kept: list[tuple[ClientJob, str, torch.Tensor]] = []
        for index, phase in enumerate(own):
            if phase.model != current:
                models[current] = flat.state()
                flat.load_state(
                    models[phase.model] if phase.model in models else _kept_model(job, phase, flat, models[None])
                )
                current = phase.model
            if phase.cached_features is not None:
                phase = _on_features(phase, job, flat)
            outcome = self.sequential.run(job, phase, index, _kept_momentum(job, phase, flat), replays)
            carries[index] = outcome.carry
            if isinstance(phase.optimizer, SGD) and phase.optimizer.keep_momentum and outcome.momentum is not None:
                kept.append((job, phase.optimizer.keep_momentum, outcome.momentum))
            if phase.reports:
                reported.extend(outcome.losses)
                summed, count = summed or outcome.summed, count + outcome.steps
        if current is not None:
            models[current] = flat.state()
            flat.load_state(models[None])
        kept.extend((job, key, value) for key, value in models.items() if key is not None)
        job.scratch[FINAL_CARRY] = carries
        _keep(kept)
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
    ) -> Trained:
        """Train ``jobs`` (clients of one architecture, sharing ``jobs[0].flat``, their phases of equal
        signatures) as one stack from ``starts`` (C, S)."""
        flat = jobs[0].flat
        if any(p.needs_start for own in phases for p in own):
            phases = [self._anchored(list(own), flat, start) for own, start in zip(phases, starts)]
        return self._stack(jobs, starts, [list(own) for own in phases], flat, replays)

    # --- a stack -----------------------------------------------------------------------------------------
    def _stack(
        self,
        jobs: Sequence[ClientJob],
        starts: torch.Tensor,
        phases: Sequence[list[Phase]],
        flat: FlatModel,
        replays: bool,
    ) -> Trained:
        runner = self._stacked.setdefault(id(flat), StackedTraining(flat, self.graphs, self.pixel_scale))
        models: dict[str | None, torch.Tensor] = {None: starts}
        loss_sums = torch.zeros(len(jobs), device=starts.device)
        steps = [0] * len(jobs)
        kept: list[tuple[ClientJob, str, torch.Tensor]] = []
        carries: list[dict[int, dict[str, torch.Tensor]]] = [{} for _ in jobs]
        for index in range(len(phases[0])):
            column = [own[index] for own in phases]
            phase = column[0]
            if phase.model not in models:
                models[phase.model] = torch.stack(
                    [_kept_model(job, p, flat, start) for job, p, start in zip(jobs, column, starts)]
                )
            momentum = None
            if _keeps_momentum(phase, jobs[0]):
                buffers = [_kept_momentum(job, phase, flat) for job in jobs]
                lo, hi = trained_range(phase, flat)
                momentum = torch.stack(
                    [b if b is not None else torch.zeros(hi - lo, device=starts.device) for b in buffers]
                )
            if phase.cached_features is not None:
                for c, job in enumerate(jobs):
                    flat.load_state(models[phase.model][c])
                    column[c] = _on_features(column[c], job, flat)
            outcome = runner.run(jobs, column, index, models[phase.model], momentum, replays)
            models[phase.model] = outcome.trained
            for c in range(len(jobs)):
                carries[c][index] = {k: v[c] for k, v in outcome.carry.items()}
            if isinstance(phase.optimizer, SGD) and phase.optimizer.keep_momentum and outcome.momentum is not None:
                kept.extend((job, phase.optimizer.keep_momentum, row) for job, row in zip(jobs, outcome.momentum))
            if phase.reports:
                loss_sums = loss_sums + outcome.loss_sums
                steps = [a + b for a, b in zip(steps, outcome.steps)]
        for key, rows in models.items():
            if key is not None:
                kept.extend((job, key, row) for job, row in zip(jobs, rows))
        for job, carry in zip(jobs, carries):
            job.scratch[FINAL_CARRY] = carry
        _keep(kept)
        counts = torch.tensor([max(n, 1) for n in steps], dtype=torch.float32)
        return Trained(models[None], loss_sums / to_device([counts], starts.device)[0], steps)

    @staticmethod
    def _anchored(phases: list[Phase], flat: FlatModel, start: torch.Tensor | None) -> list[Phase]:
        """``phases`` with ``constants["start"]`` (the round's starting parameters in logical order: of ``start``, or
        of the model in ``flat``) where asked."""
        if not any(p.needs_start for p in phases):
            return phases
        if start is None:
            anchor = torch.cat([p.detach().reshape(-1) for p in flat.params])
        else:
            anchor = logical_rows(start.unsqueeze(0), flat.layout)[0]
        return [
            dataclasses.replace(p, constants={**p.constants, "start": anchor}) if p.needs_start else p for p in phases
        ]


def _on_features(phase: Phase, job: ClientJob, flat: FlatModel) -> Phase:
    """``phase`` on the features its layer ``cached_features`` reads, computed now from the model in ``flat``."""
    name = phase.cached_features
    assert name is not None
    x, y = phase.inputs if phase.inputs is not None else (job.x_train, job.y_train)
    if len(y):
        features = torch.cat([f for _, f in features_before_output(flat.module, name, x)])
    else:
        layer = flat.module.get_submodule(name)
        assert isinstance(layer, torch.nn.Linear)
        features = x.new_empty(0, layer.in_features)
    return dataclasses.replace(phase, inputs=(features, y), forward=_layer_forward(name), cached_features=None)


@functools.cache
def _layer_forward(name: str) -> Forward:
    """The forward of a model's layer ``name`` alone (one function per name, so phases using it stack)."""

    def forward(module: torch.nn.Module, x: torch.Tensor) -> Outputs:
        return Outputs(module.get_submodule(name)(x))

    return forward


def _kept_model(job: ClientJob, phase: Phase, flat: FlatModel, round_start: torch.Tensor) -> torch.Tensor:
    """The model ``phase.model`` of the client, on the device: the one in its state, else the phase's ``start``,
    else (no start given) a copy of the round's starting model ``round_start``."""
    assert phase.model is not None
    saved = (job.state or {}).get(phase.model)
    value = saved if saved is not None and saved.shape == (flat.state_size,) else phase.start
    if value is None:
        return round_start.clone()
    return value if isinstance(value, torch.Tensor) else to_device([value], job.device)[0]


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
    if saved is None or saved.shape != (hi - lo,):
        return None
    return to_device([np.asarray(saved, dtype=np.float32)], job.device)[0]


def _keep(kept: list[tuple[ClientJob, str, torch.Tensor]]) -> None:
    """Store the kept models and momentum buffers in their clients' states, brought to the host in one transfer."""
    if not kept:
        return
    for (job, key, _), value in zip(kept, to_host([value for _, _, value in kept])):
        job.state = {**(job.state or {}), key: value}
