"""What a training step reads and changes, as typed fields: the batch (:class:`StepInputs`) and the rest
(:class:`StepState`), for one client or, one row per client, for a stack.

A step (:mod:`rayfed.train.step`) reads these fields when it runs. Run eagerly, a field is simply rebound to
each step's value (a view of the block of batches, no copy). Replayed from a CUDA graph, the captured step
reads the storage it was captured on, so a workspace made ``static`` copies each new value into the tensor
it already holds (:func:`into`): the same step function serves both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Literal

import torch

from rayfed.train.phase import Adam, Phase
from rayfed.train.update import OptimizerState

__all__ = ["into", "StepInputs", "StepState"]


def into(held: torch.Tensor | None, value: torch.Tensor | None, static: bool) -> torch.Tensor | None:
    """What a step reads as ``value``: ``value`` itself, or (``static``) the tensor already ``held`` with
    ``value`` copied in (a copy of ``value`` the first time, or when its shape changed)."""
    if not static or value is None:
        return value
    if held is None or held.shape != value.shape or held.dtype != value.dtype:
        return value.clone()
    held.copy_(value)
    return held


def _into_all(held: Mapping[str, torch.Tensor], values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, value in values.items():
        tensor = into(held.get(name), value, True)
        assert tensor is not None
        out[name] = tensor
    return out


@dataclass
class StepInputs:
    """A step's batch: inputs, targets, the padding weights of a stack's short batches, each sample's view draws,
    and Adam's scalars of the step (each None where the phase has none)."""

    x: torch.Tensor | None = None
    y: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    draws: torch.Tensor | None = None
    adam: torch.Tensor | None = None

    def fill(self, static: bool, **values: torch.Tensor | None) -> None:
        """Make ``values`` (by field name) what the next step reads."""
        for name, value in values.items():
            setattr(self, name, into(getattr(self, name), value, static))


@dataclass
class StepState:
    """What a phase's steps read and change besides the model and the batch."""

    lr: torch.Tensor
    """The round's learning rate, 0-d; in a stack of runs packed together that differ in it, one per lane, laid out as
    the trained parameters (:func:`~rayfed.train.stacked.lane_rates`)."""
    step: torch.Tensor | None
    """The step's index in the phase, 0-d int64 (one per lane, (width,), in a packed stack), where something reads
    it (:func:`~rayfed.train.step.reads_steps`: ``Batch.step``, dropout masks); else None."""
    seeds: torch.Tensor | None
    """The clients' dropout seeds (one per client), None without dropout."""
    constants: dict[str, torch.Tensor]
    optimizer: OptimizerState
    """The optimiser's buffers of the trained parameters."""
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    """The phase's trainables' values."""
    extra_lr: dict[str, torch.Tensor] = field(default_factory=dict)
    extra_optimizer: dict[str, OptimizerState] = field(default_factory=dict)
    loss_sums: torch.Tensor | None = None
    """Each client's summed reported loss; None where the losses are kept step by step (:class:`LossRecord`)."""

    def refill(self, values: StepState) -> None:
        """Take ``values`` (a new phase's, or a new client's of the same phase), copied into the tensors held (a
        captured step reads them)."""
        for f in fields(self):
            held, value = getattr(self, f.name), getattr(values, f.name)
            if isinstance(value, OptimizerState):
                held.refill(value)
            elif f.name == "extra_optimizer":
                for name, state in value.items():
                    held[name].refill(state)
            elif isinstance(value, dict):
                setattr(self, f.name, _into_all(held, value))
            else:
                setattr(self, f.name, into(held, value, True))

    def copy(self) -> StepState:
        """This state in storage of its own."""

        def c(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.clone()

        return StepState(
            lr=self.lr.clone(),
            step=c(self.step),
            seeds=c(self.seeds),
            constants={k: v.clone() for k, v in self.constants.items()},
            optimizer=self.optimizer.copy(),
            extra={k: v.clone() for k, v in self.extra.items()},
            extra_lr={k: v.clone() for k, v in self.extra_lr.items()},
            extra_optimizer={k: o.copy() for k, o in self.extra_optimizer.items()},
            loss_sums=c(self.loss_sums),
        )

    def mutable(self) -> list[torch.Tensor]:
        """The tensors a step changes (a CUDA graph's warm-up restores them)."""
        out = [*([] if self.step is None else [self.step]), *self.optimizer.tensors(), *self.extra.values()]
        for state in self.extra_optimizer.values():
            out.extend(state.tensors())
        if self.loss_sums is not None:
            out.append(self.loss_sums)
        return out

    @classmethod
    def new(
        cls,
        phase: Phase,
        trained: torch.Tensor,
        momentum: float,
        *,
        counts_steps: bool,
        lr: torch.Tensor,
        seeds: torch.Tensor | None,
        constants: dict[str, torch.Tensor],
        extra: dict[str, torch.Tensor],
        extra_lr: dict[str, torch.Tensor],
        loss_sums: torch.Tensor | None,
    ) -> StepState:
        """A phase's starting state: zero optimiser buffers (of ``trained`` and of each trainable) as a new
        optimiser's, the step 0 where ``counts_steps``."""
        kind: Literal["adam", "momentum", "none"] = (
            "adam" if isinstance(phase.optimizer, Adam) else "momentum" if momentum else "none"
        )
        return cls(
            lr=lr,
            step=torch.zeros((), dtype=torch.int64, device=trained.device) if counts_steps else None,
            seeds=seeds,
            constants=constants,
            optimizer=OptimizerState.zeros(kind, trained),
            extra=extra,
            extra_lr=extra_lr,
            extra_optimizer={name: OptimizerState.zeros(kind, value) for name, value in extra.items()},
            loss_sums=loss_sums,
        )
