"""The mechanism's Gaussian noise, drawn from the run's seed and the round: the same config gives the same bits
on any backend, pool or device (the noise is drawn in numpy on the host), and a resumed round draws what the
first attempt drew.

Central DP draws one vector for the round's sum (stream 0); local DP one for each client (stream 1 + its id).
"""

from __future__ import annotations

import numpy as np

__all__ = ["gaussian_noise", "SERVER_STREAM", "COUNT_STREAM"]

_PRIVACY = 0x5052  # the seed streams' tag of the privacy noise (rayfed.util.seeding's streams are 1, 2, 3)
SERVER_STREAM = 0
"""The stream of the server's noise; client i's local noise is stream i + 1."""
COUNT_STREAM = 2**32
"""The stream of the noise on adaptive clipping's count of unclipped updates (beyond every client's)."""


def gaussian_noise(seed: int, round_index: int, stream: int, size: int, std: float) -> np.ndarray:
    """(size,) float32 samples of N(0, std²) for round ``round_index`` of a run seeded ``seed``."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, _PRIVACY, round_index + 1, stream]))
    return rng.standard_normal(size, dtype=np.float32) * np.float32(std)
