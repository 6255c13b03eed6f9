"""Seeds derived from the run seed, so every random choice is reproducible and local.

Three streams are kept apart, as the papers' protocol needs ("3 seeds over a fixed
partition"): the partition seed (``data.seed``), the model initialisation
(``seed``), and per-round streams for client sampling and each client's batches.
A client's stream depends only on (seed, round, client id), never on which worker
runs it, so a re-run client (after a worker failure) repeats the same update.
"""

from __future__ import annotations

import functools
import logging
import math

import numpy as np

__all__ = [
    "client_seed",
    "sample_clients",
    "sample_among",
    "poisson_sample",
    "participants",
    "PARTICIPATION",
    "init_seed",
]

PARTICIPATION = ("fixed", "poisson")
"""How a round samples its clients (``engine.participation``): ⌊join_ratio·M⌋ drawn without replacement, or each
client independently with probability join_ratio (Poisson sampling, the DP-FedAvg paper's)."""

logger = logging.getLogger(__name__)

_SAMPLING, _CLIENT, _INIT = 1, 2, 3


def client_seed(seed: int, round_index: int, client_id: int) -> int:
    """A 63-bit seed for one client's mini-batch order in one round."""
    state = np.random.SeedSequence([seed, _CLIENT, round_index + 1, client_id]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


def init_seed(seed: int, stream: int = 0) -> int:
    """Seed for model initialisation (stream > 0 for per-client initialisations)."""
    return int(np.random.SeedSequence([seed, _INIT, stream]).generate_state(1, dtype=np.uint32)[0])


def participants(num_clients: int, join_ratio: float) -> int:
    """How many clients a round samples: ⌊join_ratio·M⌋, at least 1 (all M with ``join_ratio`` >= 1)."""
    return num_clients if join_ratio >= 1.0 else max(1, int(join_ratio * num_clients))


def sample_clients(seed: int, round_index: int, num_clients: int, join_ratio: float) -> np.ndarray:
    """Sorted ids of the round's participants: ⌊join_ratio·M⌋ (at least 1) drawn without replacement.

    When that count is not join_ratio·M (rounded down, or raised to 1), a warning names both, once.
    """
    if join_ratio >= 1.0:
        return np.arange(num_clients, dtype=np.int64)
    count = participants(num_clients, join_ratio)
    _warn_if_rounded(join_ratio, num_clients, count)
    return sample_among(seed, round_index, np.arange(num_clients, dtype=np.int64), count)


def sample_among(seed: int, round_index: int, candidates: np.ndarray, count: int) -> np.ndarray:
    """Sorted ``count`` of the sorted ids ``candidates``, drawn without replacement from the round's sampling
    stream (all of them when there are no more): with every client a candidate, :func:`sample_clients`'s draw,
    so a round that samples among the clients online draws the same clients when all of them are.

    >>> sample_among(0, 3, np.arange(10), 4).tolist() == sample_clients(0, 3, 10, 0.4).tolist()
    True
    """
    if count >= len(candidates):
        return np.asarray(candidates, dtype=np.int64).copy()
    rng = np.random.default_rng(np.random.SeedSequence([seed, _SAMPLING, round_index]))
    return np.sort(np.asarray(candidates, dtype=np.int64)[rng.choice(len(candidates), size=count, replace=False)])


def poisson_sample(seed: int, round_index: int, candidates: np.ndarray, rate: float) -> np.ndarray:
    """Sorted ids of the ``candidates`` that join the round, each independently with probability ``rate``
    (Poisson sampling; possibly none), from the round's sampling stream: one uniform number per candidate, in the
    order of ``candidates``, so the draw is the same on any backend or pool.

    >>> poisson_sample(0, 3, np.arange(10), 1.0).tolist() == list(range(10))
    True
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, _SAMPLING, round_index]))
    joins = rng.random(len(candidates)) < rate
    return np.sort(np.asarray(candidates, dtype=np.int64)[joins])


@functools.cache  # once per (join_ratio, M) in a process: every round samples the same count
def _warn_if_rounded(join_ratio: float, num_clients: int, count: int) -> None:
    asked = join_ratio * num_clients
    if not math.isclose(asked, count, rel_tol=1e-9):
        logger.warning(
            "engine.join_ratio=%g of data.num_clients=%d asks for %.3g clients per round; each round samples %d "
            "(a join ratio of %.3g)",
            join_ratio,
            num_clients,
            asked,
            count,
            count / num_clients,
        )
