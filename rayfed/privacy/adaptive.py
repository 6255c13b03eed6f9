"""Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with Adaptive
Clipping", NeurIPS 2021): the clip norm follows the γ-quantile of the clients' update norms, learnt from how many
updates it left unclipped, itself noised so that the estimate is private too.

Each round t, client i reports the bit b_i = 1[‖Δ_i‖ ≤ C_t]; the server noises the sum of the centred bits
b_i − ½ (Algorithm 1, whose count then moves by at most ½ when one client is added or removed, 1 when one is
replaced) and moves the clip norm:

    b̃_t = (Σ_i (b_i − ½) + N(0, σ_b²)) / m + ½                                  (the noised unclipped fraction)
    C_{t+1} = C_t · exp(−η_C (b̃_t − γ))                                         (geometric update, Eq. 2)

A method that uploads P parts (rayfed.algorithms.private_uploads.PartwiseUpload) adapts each part's bound B_k so,
from its own bit b_ik = 1[‖x_ik‖ ≤ B_k,t], each count noised with its own N(0, σ_b²): the P centred bits of one
client are a vector of L2 norm √P/2, so the P counts are one Gaussian release of sensitivity √P/2 and noise σ_b.
The update's release and the counts' are together one Gaussian of multiplier z (Theorem 1), so the update's own
noise multiplier is

    z_Δ = (z^{−2} − P·(2σ_b)^{−2})^{−1/2}                                        (Section 3.2, P counts)

which is finite only while 2σ_b > z·√P (P = 1: a model's one count). Under replacing one client every release's
sensitivity doubles (the update's 2C, the count's 1), so the same z_Δ holds relative to the accountant's z/2.
The paper takes σ_b = m/20 and η_C = 0.2.
"""

from __future__ import annotations

import math

__all__ = ["next_clip_norm", "update_noise_multiplier", "default_count_noise", "noised_fraction"]


def next_clip_norm(
    clip_norm: float, unclipped_fraction: float, quantile: float, lr: float, ceiling: float = math.inf
) -> float:
    """C_{t+1} = min(ceiling, C_t · exp(−η_C (b̃_t − γ))) (Eq. 2; ``ceiling``: a statistic's own bound, above which
    a clip bounds nothing more, post-processing of b̃_t); C_t itself in a round without a finite b̃_t."""
    if not math.isfinite(unclipped_fraction):
        return clip_norm
    return min(ceiling, clip_norm * math.exp(-lr * (unclipped_fraction - quantile)))


def noised_fraction(unclipped: float, reported: int, noise: float, planned: float) -> float:
    """b̃_t = (Σ_i (b_i − ½) + noise) / m + ½ of ``reported`` clients of which ``unclipped`` were within the bound,
    the fixed denominator m = ``planned`` (Algorithm 1, centred bits)."""
    return (unclipped - reported / 2 + noise) / planned + 0.5


def update_noise_multiplier(noise_multiplier: float, count_noise: float, counts: int = 1) -> float:
    """z_Δ, the update's share of the noise multiplier z when ``counts`` counts (one per part) are noised with σ_b
    each (Section 3.2, module docstring); inf where 2σ_b <= z·√P (the counts would take all of the budget); z
    itself when z = 0 or the counts are not noised."""
    if noise_multiplier == 0 or count_noise == 0:
        return noise_multiplier
    rest = noise_multiplier**-2 - counts * (2 * count_noise) ** -2
    return math.inf if rest <= 0 else rest**-0.5


def default_count_noise(per_round: int) -> float:
    """σ_b = m/20, the paper's choice for m clients a round."""
    return per_round / 20
