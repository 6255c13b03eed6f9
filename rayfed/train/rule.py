"""A phase's arithmetic at every step, written once for one client and for a stack of clients.

:class:`PhaseRule` holds what a step does besides the forward: the loss (the sample-weighted cross-entropy
of each client's logits and the phase's own term), the hooks' edits of parameters and gradients, and the
optimiser's update (:mod:`rayfed.train.update`). The sequential step (:mod:`rayfed.train.sequential`) hands
it one client's tensors; the stacked step (:mod:`rayfed.train.stacked`) every client's at once, and the
rule runs the phase's per-client hooks under ``torch.func.vmap`` (:func:`~rayfed.train.step_io.per_client`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from rayfed.train.phase import SGD, Adam, Batch, NoStep, Outputs, Phase
from rayfed.train.step_io import StepIO, per_client
from rayfed.train.update import adam_update, sgd_update

if TYPE_CHECKING:
    from rayfed.train.settings import TrainConfig

__all__ = ["PhaseRule", "CONSTANTS", "CARRY"]

CONSTANTS, CARRY = "const.", "carry."
"""Prefixes of a step's constants and carry in its :class:`~rayfed.train.step_io.StepIO`."""


class PhaseRule:
    """One phase's loss, edits and update (module docstring); ``stacked`` runs the hooks per client."""

    def __init__(self, phase: Phase, train: TrainConfig, stacked: bool) -> None:
        self.phase, self.stacked = phase, stacked
        optimizer = phase.optimizer
        self.momentum = 0.0
        self.weight_decay = 0.0
        if isinstance(optimizer, SGD):
            self.momentum = train.momentum if optimizer.momentum is None else optimizer.momentum
            self.weight_decay = train.weight_decay if optimizer.weight_decay is None else optimizer.weight_decay
        term = phase.loss

        def client_term(logits: Any, features: Any, y: Any, weight: Any, step: Any, params: Any, constants: Any) -> Any:
            assert term is not None
            return term(Outputs(logits, features), Batch(y, weight, step), params, constants)

        self._term = client_term
        self._hooks: dict[tuple[str, tuple[Any, ...]], Any] = {}

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
        fn = self._vmapped(
            "term", self._term, (1, None if features is None else 1, 1, None if weight is None else 1, None, 0, 0)
        )
        return fn(logits, features, labels, weight, step, list(params), constants)

    # --- the hooks ---------------------------------------------------------------------------------------
    def edit_params(self, name: str, params: Sequence[torch.Tensor], io: StepIO) -> None:
        """Run the parameter hook ``name`` (``on_train_batch_start``, ...) and write its edits and carry."""
        hook = getattr(self.phase, name)
        if hook is None:
            return
        fn = self._vmapped(name, hook, (0, 0, 0))
        with torch.no_grad():  # hooks edit values; autograd never sees them (no detached copies either)
            edits, carry = fn(list(params), io.group(CONSTANTS), io.group(CARRY))
            for index, value in edits.items():
                params[index].copy_(value)
        io.put_all(CARRY, carry)

    def edit_grads(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None], io: StepIO) -> None:
        """Run ``on_after_backward`` and write its gradient edits and carry (``grads``: None where a parameter is
        frozen)."""
        hook = self.phase.on_after_backward
        if hook is None:
            return
        fn = self._vmapped("on_after_backward", hook, (0, 0, 0, 0))
        with torch.no_grad():
            edits, carry = fn(list(params), list(grads), io.group(CONSTANTS), io.group(CARRY))
            for index, value in edits.items():
                target = grads[index]
                assert target is not None, "on_after_backward edited the gradient of a frozen parameter"
                target.copy_(value)
        io.put_all(CARRY, carry)

    def _vmapped(self, name: str, fn: Any, in_dims: tuple[Any, ...]) -> Any:
        key = (name, in_dims)
        if key not in self._hooks:
            self._hooks[key] = per_client(fn, in_dims, self.stacked)
        return self._hooks[key]

    # --- the optimiser -----------------------------------------------------------------------------------
    def optimizer_state(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        """The optimiser's buffers for ``params`` (the trained range), zero as a new optimiser's."""
        optimizer = self.phase.optimizer
        if isinstance(optimizer, Adam):
            return {"exp_avg": torch.zeros_like(params), "exp_avg_sq": torch.zeros_like(params)}
        if isinstance(optimizer, SGD) and self.momentum:
            return {"momentum": torch.zeros_like(params)}
        return {}

    def update(
        self,
        params: torch.Tensor,
        grad: torch.Tensor,
        state: dict[str, torch.Tensor],
        lr: torch.Tensor,
        adam: torch.Tensor | None,
    ) -> None:
        """The optimiser's step on ``params`` (the trained range, in place) from ``grad``: SGD at the learning rate
        ``lr``, Adam with the step's scalars ``adam`` (:func:`~rayfed.train.update.adam_scalars`)."""
        optimizer = self.phase.optimizer
        if isinstance(optimizer, NoStep):
            return
        if isinstance(optimizer, Adam):
            assert adam is not None
            adam_update(params, grad, state["exp_avg"], state["exp_avg_sq"], optimizer.betas, optimizer.eps, adam)
            return
        sgd_update(
            params, grad, lr, momentum=self.momentum, weight_decay=self.weight_decay, buffer=state.get("momentum")
        )
