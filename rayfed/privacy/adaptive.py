"""Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with Adaptive
Clipping", NeurIPS 2021): the clip norm follows the γ-quantile of the clients' update norms, learnt from how many
updates it left unclipped, itself noised so that the estimate is private too.

Each round t, client i reports the bit b_i = 1[‖Δ_i‖ ≤ C_t]; the server noises their sum (Algorithm 1):

    b̃_t = (Σ_i b_i + N(0, σ_b²)) / m                                           (the noised unclipped fraction)
    C_{t+1} = C_t · exp(−η_C (b̃_t − γ))                                         (geometric update, Eq. 2)

and the two Gaussian releases together are one Gaussian of multiplier z (Theorem 1), so the update's own noise
multiplier is

    z_Δ = (z^{−2} − (2σ_b)^{−2})^{−1/2}                                          (Section 3.2)

which is finite only while 2σ_b > z. The paper takes σ_b = m/20 and η_C = 0.2.
"""

from __future__ import annotations

import math

__all__ = ["next_clip_norm", "update_noise_multiplier", "default_count_noise"]


def next_clip_norm(clip_norm: float, unclipped_fraction: float, quantile: float, lr: float) -> float:
    """C_{t+1} = C_t · exp(−η_C (b̃_t − γ)) (Eq. 2); C_t itself in a round without a finite b̃_t (no uploads)."""
    if not math.isfinite(unclipped_fraction):
        return clip_norm
    return clip_norm * math.exp(-lr * (unclipped_fraction - quantile))


def update_noise_multiplier(noise_multiplier: float, count_noise: float) -> float:
    """z_Δ, the update's share of the noise multiplier z when the count's noise is σ_b (Section 3.2); inf where
    2σ_b <= z (the count would take all of the budget); z itself when z = 0 or the count is not noised."""
    if noise_multiplier == 0 or count_noise == 0:
        return noise_multiplier
    rest = noise_multiplier**-2 - (2 * count_noise) ** -2
    return math.inf if rest <= 0 else rest**-0.5


def default_count_noise(per_round: int) -> float:
    """σ_b = m/20, the paper's choice for m clients a round."""
    return per_round / 20
