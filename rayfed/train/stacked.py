"""Vectorised client training ("client stacking"): C clients of one architecture in one step.

With ``torch.func`` a worker trains C copies of a small model on C clients' batches at
once: the clients' parameter vectors form a (C, P) stack, and each step evaluates
``vmap(grad(loss))`` over (parameters, batch) pairs, then updates the whole stack with one
fused operation. On a GPU this turns C small, latency-bound steps into one large one.

Clients of unequal data size are handled exactly:

* each client draws its own batch order from its own generator, in the same way as
  :func:`rayfed.train.sgd.local_sgd`, so both paths see the same batches;
* client c takes ``steps_c`` steps per epoch; at step s a client with ``s >= steps_c``
  is *inactive*: its update is masked to zero;
* a short last batch (``drop_last=False``) is padded, and padded samples get weight 0
  in the per-client mean cross-entropy.

The result equals the sequential path within float tolerance (tested). Models with
BatchNorm buffers are trained sequentially (their running statistics are updated in
place, which ``vmap`` cannot batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from rayfed.train.flat import FlatModel
from rayfed.train.job import ClientJob, TrainStats
from rayfed.train.sgd import minibatches

__all__ = ["can_stack", "train_stacked", "resolve_vectorize"]


def resolve_vectorize(setting: str, device: torch.device) -> bool:
    """``engine.vectorize``: ``on``/``off``, or ``auto`` = stack on CUDA, sequential on CPU.

    On CPU, stacked training was slower than one client at a time at every stack size
    (vmapped small convolutions do not use a core better, and large stacks fall out of
    cache; benchmarks/README.md, "Stacked (vmap) against sequential training on CPU").
    On a GPU the sequential loop is latency-bound and stacking is expected to be faster.
    """
    if setting == "auto":
        return device.type == "cuda"
    return setting == "on"


def can_stack(flat: FlatModel, client_half: Any) -> bool:
    """Whether these clients can train stacked: no BatchNorm buffers, and a client half
    that trains with the default loop and states its extra loss functionally."""
    return flat.buffer_layout.size == 0 and bool(getattr(client_half, "supports_stacking", lambda: False)())


def _unflatten(vector: torch.Tensor, flat: FlatModel) -> dict[str, torch.Tensor]:
    return {name: flat.layout.view(vector, i) for i, name in enumerate(flat.layout.names)}


def _batch_plan(
    jobs: Sequence[ClientJob], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Per client and step, global sample indices (C, S, B), sample weights (C, S, B) and activity (C, S).

    Client c's steps are the batches of :func:`rayfed.train.sgd.minibatches`, the ones
    :func:`rayfed.train.sgd.local_sgd` takes, offset into the stacked data; a short batch is
    padded with weight-0 samples, and steps past the client's last are inactive.
    """
    batch = jobs[0].train.batch_size
    plans, offset = [], 0
    for job in jobs:
        rows = [F.pad(idx.to(device) + offset, (0, batch - len(idx)), value=-1) for idx in minibatches(job)]
        plans.append(torch.stack(rows) if rows else torch.empty(0, batch, dtype=torch.long, device=device))
        offset += job.num_train
    max_steps = max(len(p) for p in plans)
    plan = torch.full((len(jobs), max_steps, batch), -1, dtype=torch.long, device=device)
    for c, steps in enumerate(plans):
        plan[c, : len(steps)] = steps
    valid = plan >= 0
    return plan.clamp_min(0), valid.float(), valid.any(dim=2), max_steps


def train_stacked(
    jobs: Sequence[ClientJob],
    starts: torch.Tensor,
    client_half: Any,
    constants: Sequence[Mapping[str, torch.Tensor]],
) -> tuple[torch.Tensor, list[TrainStats]]:
    """Train ``len(jobs)`` clients of one architecture together from their starting vectors.

    ``starts`` is (C, P): client c's personalised starting point; ``constants[c]`` its
    ``client_half.loss_constants`` taken right after its personalisation. Returns the
    (C, P) trained vectors and each client's :class:`TrainStats` (mean CE over its steps).
    """
    flat = jobs[0].flat
    module, device = flat.module, starts.device
    module.train()
    lr, momentum, weight_decay = jobs[0].lr, jobs[0].train.momentum, jobs[0].train.weight_decay
    x_all = torch.cat([job.x_train for job in jobs])
    y_all = torch.cat([job.y_train for job in jobs])
    index, weight, active, max_steps = _batch_plan(jobs, device)
    stacked_constants = _stack_constants(constants)

    def loss(vector: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, consts: Mapping[str, Any]):
        params = _unflatten(vector, flat)
        logits = functional_call(module, params, (x,))
        ce = (F.cross_entropy(logits, y, reduction="none") * w).sum() / w.sum().clamp_min(1.0)
        extra = client_half.functional_extra_loss(list(params.values()), consts)
        return (ce if extra is None else ce + extra), ce.detach()

    step_grad = vmap(grad(loss, has_aux=True), in_dims=(0, 0, 0, 0, 0 if stacked_constants else None))
    vectors = starts.clone()
    buffers = torch.zeros_like(vectors) if momentum else None
    loss_sum = torch.zeros(len(jobs), device=device)
    for s in range(max_steps):
        idx = index[:, s]
        grads, ce = step_grad(vectors, x_all[idx], y_all[idx], weight[:, s], stacked_constants or {})
        mask = active[:, s].to(vectors.dtype).unsqueeze(1)
        if weight_decay:
            grads = grads + weight_decay * vectors
        if buffers is not None:
            buffers.mul_(torch.where(mask > 0, momentum, 1.0)).add_(grads * mask)
            grads = buffers
        vectors.sub_(lr * grads * mask)
        loss_sum += ce * mask.squeeze(1)
    steps = active.sum(dim=1)
    stats = [
        TrainStats(loss=float(loss_sum[c] / steps[c]) if steps[c] else float("nan"), steps=int(steps[c]))
        for c in range(len(jobs))
    ]
    return vectors, stats


def _stack_constants(per_client: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    if not per_client or not per_client[0]:
        return {}
    return {key: torch.stack([c[key] for c in per_client]) for key in per_client[0]}
