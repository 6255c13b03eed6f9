"""A phase's arithmetic at every step, written once for one client and for a stack of clients.

:class:`PhaseRule` holds what a step does besides the forward: the loss (the sample-weighted cross-entropy
of each client's logits and the phase's own term), the hooks' edits of parameters, gradients and trainables,
and the optimiser's update of the trained parameters and of the trainables (:mod:`rayfed.train.update`). The
step (:mod:`rayfed.train.step`) hands it one client's tensors, or every client's of a stack at once; for a
stack the rule runs the phase's per-client functions under ``torch.func.vmap``. What the functions return is
checked (:class:`~rayfed.train.phase_checks.HookResults`) before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from rayfed.train.phase import NO_PARAMETERS, SGD, Adam, Batch, NoStep, Outputs, Phase
from rayfed.train.phase_checks import HookResults
from rayfed.train.update import OptimizerState, adam_update, sgd_update
from rayfed.train.workspace import StepState

if TYPE_CHECKING:
    from rayfed.train.settings import TrainConfig

__all__ = ["PhaseRule"]


def _whole(tensor: torch.Tensor) -> list[torch.Tensor]:
    """A tensor as the one piece an update takes."""
    return [tensor]


class PhaseRule:
    """One phase's loss, edits and updates (module docstring); ``stacked`` runs the per-client functions over a
    stack. ``where`` names the phase in errors; ``shapes`` are the model's parameter shapes."""

    def __init__(
        self, phase: Phase, train: TrainConfig, *, stacked: bool, where: str, shapes: Sequence[tuple[int, ...]]
    ) -> None:
        self.phase, self.stacked = phase, stacked
        optimizer = phase.optimizer
        self.momentum = 0.0
        self.weight_decay = 0.0
        if isinstance(optimizer, SGD):
            self.momentum = train.momentum if optimizer.momentum is None else optimizer.momentum
            self.weight_decay = train.weight_decay if optimizer.weight_decay is None else optimizer.weight_decay
        self.steps_parameters = not isinstance(optimizer, NoStep) and tuple(phase.trains or ()) != NO_PARAMETERS
        self.results = HookResults(where, shapes, {k: tuple(v.value.shape) for k, v in phase.extra.items()})
        term, check = phase.loss, self.results.loss

        def client_term(logits: Any, features: Any, y: Any, weight: Any, step: Any, params: Any, constants: Any) -> Any:
            assert term is not None
            return check(term(Outputs(logits, features), Batch(y, weight, step), params, constants))

        self._term = client_term
        self._mapped: dict[tuple[str, Any], Callable[..., Any]] = {}

    # --- the loss ----------------------------------------------------------------------------------------
    def cross_entropy(
        self, logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None, width: int
    ) -> torch.Tensor:
        """Each client's mean cross-entropy over its samples (weighted by ``weight`` where padded): a 0-d tensor
        for one client, (width,) for a stack, whose logits are (batch, width·K) and labels (batch·width,)."""
        if not self.stacked:
            return F.cross_entropy(logits, y)
        batch = logits.shape[0]
        losses = F.cross_entropy(logits.view(batch * width, -1), y, reduction="none").view(batch, width)
        if weight is None:
            return losses.mean(dim=0)
        return (losses * weight).sum(dim=0) / weight.sum(dim=0).clamp_min(1.0)

    def term(
        self,
        outputs: Outputs,
        y: torch.Tensor,
        weight: torch.Tensor | None,
        step: torch.Tensor,
        params: Sequence[torch.Tensor],
        constants: dict[str, torch.Tensor],
        width: int,
    ) -> torch.Tensor:
        """The phase's own term: one client's, or each client's of a stack, (width,)."""
        if not self.stacked:
            return self._term(outputs.logits, outputs.features, y, weight, step, params, constants)
        batch = outputs.logits.shape[0]
        logits = outputs.logits.view(batch, width, -1)
        features = None if outputs.features is None else outputs.features.unflatten(1, (width, -1))
        labels = y.view(batch, width, *y.shape[1:])
        args = (logits, features, labels, weight, step, list(params), constants)
        step_dim = None if step.dim() == 0 else 0  # a packed stack's lanes count their own steps
        dims = (1, None if features is None else 1, 1, None if weight is None else 1, step_dim, 0, 0)
        return self._per_client("term", self._term, dims)(*args)

    # --- the hooks ---------------------------------------------------------------------------------------
    def edit_params(self, name: str, params: Sequence[torch.Tensor], state: StepState) -> None:
        """Run the parameter hook ``name`` (``on_train_batch_start``, ``on_train_end``) and write its edits into
        the parameters and trainables."""
        hook = getattr(self.phase, name)
        if hook is None:
            return
        with torch.no_grad():  # hooks edit values; autograd never sees them (no detached copies either)
            edits = self._call(name, self._checked(name, hook, False), (list(params), state.constants, state.extra))
            for key, value in edits.items():
                target = params[key] if isinstance(key, int) else state.extra[key]
                target.copy_(value)

    def edit_grads(
        self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None], state: StepState
    ) -> dict[str, torch.Tensor]:
        """Run ``on_after_backward``: write its edits into the gradients (``grads``: None where a parameter does
        not train) and return the trainables' gradients it gives."""
        hook = self.phase.on_after_backward
        if hook is None:
            return {}
        with torch.no_grad():
            checked = self._checked("on_after_backward", hook, True)
            edits = self._call("on_after_backward", checked, (list(params), list(grads), state.constants, state.extra))
            extra = {}
            for key, value in edits.items():
                if isinstance(key, str):
                    extra[key] = value
                    continue
                target = grads[key]
                if target is None:
                    raise ValueError(
                        f"{self.results.where}: on_after_backward edited the gradient of parameter "
                        f"{key}, which the phase does not train (Phase.trains)"
                    )
                target.copy_(value)
        return extra

    def _checked(self, name: str, hook: Callable[..., Any], gradients: bool) -> Callable[..., Any]:
        """``hook`` whose every return (one client's, inside vmap for a stack) is checked first."""
        check = self.results.edits

        def checked(*args: Any) -> Any:
            return check(name, hook(*args), gradients=gradients)

        return checked

    def _call(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """``fn(*args)`` for one client, or under vmap for a stack (None leaves, frozen gradients, not mapped)."""
        if not self.stacked:
            return fn(*args)
        return self._per_client(name, fn, tuple(_mapped_dims(arg) for arg in args))(*args)

    def _per_client(self, name: str, fn: Callable[..., Any], in_dims: tuple[Any, ...]) -> Callable[..., Any]:
        key = (name, repr(in_dims))
        if key not in self._mapped:
            self._mapped[key] = torch.func.vmap(fn, in_dims=in_dims)
        return self._mapped[key]

    # --- the optimiser -----------------------------------------------------------------------------------
    def update(
        self,
        values: list[torch.Tensor],
        grads: list[torch.Tensor],
        buffers: OptimizerState,
        lr: torch.Tensor,
        adam: torch.Tensor | None,
        pieces: Callable[[torch.Tensor], list[torch.Tensor]] = _whole,
    ) -> None:
        """The optimiser's step on ``values`` (in place) from ``grads``, pieces of one another's shapes: SGD at the
        learning rate ``lr``, Adam with the step's scalars ``adam`` (:func:`~rayfed.train.update.adam_scalars`).
        ``pieces`` cuts the optimiser's ``buffers`` (laid out as the values end to end) as the values are cut."""
        optimizer = self.phase.optimizer
        if isinstance(optimizer, NoStep):
            return
        if isinstance(optimizer, Adam):
            assert adam is not None and buffers.exp_avg is not None and buffers.exp_avg_sq is not None
            moments = pieces(buffers.exp_avg), pieces(buffers.exp_avg_sq)
            adam_update(values, grads, *moments, optimizer.betas, optimizer.eps, adam)
            return
        momentum = None if buffers.momentum is None else pieces(buffers.momentum)
        sgd_update(values, grads, lr, momentum=self.momentum, weight_decay=self.weight_decay, buffers=momentum)

    def update_extra(self, state: StepState, grads: Mapping[str, torch.Tensor], adam: torch.Tensor | None) -> None:
        """The same optimiser's step on every trainable, from the gradient ``on_after_backward`` gave it."""
        for name, value in state.extra.items():
            lr = state.extra_lr.get(name, state.lr)
            self.update([value], [grads[name]], state.extra_optimizer[name], lr, adam)


def _mapped_dims(value: Any) -> Any:
    """vmap's ``in_dims`` for a hook argument of a stack (a list of tensors, a dict of them): dimension 0 of each
    tensor, None where an entry is None (a gradient the phase does not compute)."""
    if isinstance(value, list):
        return [None if v is None else 0 for v in value]
    if isinstance(value, dict):
        return {k: None if v is None else 0 for k, v in value.items()}
    return None if value is None else 0
