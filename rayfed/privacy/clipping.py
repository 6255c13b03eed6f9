"""Per-client L2 clipping of updates (DP-FedAvg, McMahan et al. ICLR 2018, Algorithm 1's ``ClipFn``):

    Δ̃_i = Δ_i · min(1, C / ‖Δ_i‖₂),   Δ_i = θ_i − θ_g                              (clip)

written once over the last axis of a tensor, so one client's update (S,) and a stack's (L, S) are clipped by the
same arithmetic, lane by lane, on the device and without reading anything back. The upload built from it is the
clipped model θ_g + Δ̃_i; a client whose update is within the bound uploads its trained model θ_i itself, bit for
bit, which is why ``C = inf`` (no clipping) leaves FedAvg's numbers as they are.
"""

from __future__ import annotations

from typing import Any

__all__ = ["clipped_delta", "clipped_model", "unclipped", "within"]


def clipped_delta(delta: Any, clip_norm: float) -> Any:
    """Δ̃ = Δ · min(1, C/‖Δ‖) over the last axis of the tensor ``delta`` (eq. clip; one row per client). A zero
    update stays zero; the result's norm is C up to float rounding where Δ was longer."""
    import torch  # a worker's: clipping happens where clients train

    norm = torch.linalg.vector_norm(delta, dim=-1, keepdim=True)
    factor = torch.clamp(clip_norm / norm, max=1.0)  # norm = 0 gives inf, clamped to 1
    return delta * factor


def clipped_model(trained: Any, start: Any, clip_norm: float) -> Any:
    """θ̃ = θ_g + Δ̃ where ‖θ − θ_g‖ > C, else θ itself (its bits untouched), over the last axis of ``trained`` and
    ``start`` (one client's (S,) states, or a stack's (L, S)): what a clipped client uploads."""
    import torch

    delta = trained - start
    norm = torch.linalg.vector_norm(delta, dim=-1, keepdim=True)
    return torch.where(norm > clip_norm, start + clipped_delta(delta, clip_norm), trained)


def unclipped(trained: Any, start: Any, clip_norm: float) -> Any:
    """1[‖θ − θ_g‖ ≤ C] per row, as float32 (adaptive clipping's bits, :mod:`rayfed.privacy.adaptive`)."""
    return within(trained - start, clip_norm)


def within(delta: Any, bound: float) -> Any:
    """1[‖x‖ ≤ B] over the last axis of ``delta``, as float32: the bits a clip to ``bound`` leaves unchanged."""
    import torch

    return (torch.linalg.vector_norm(delta, dim=-1) <= bound).float()
