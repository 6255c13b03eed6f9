"""Can the clients train? Checked once the partition exists, before anything is written.

Local SGD runs ``floor(n_i / B)`` mini-batches per epoch on a client with ``n_i``
training samples and batch size ``B`` when ``train.drop_last`` is set (PFLlib's data
loaders, which the cwFedAvg papers' code uses; docs/algorithms.md, cwFedAvg section),
and ``ceil(n_i / B)`` otherwise. A client below one mini-batch takes no step: its model
is the server's, its loss is undefined. A run in which no client can step would train
nothing and still exit normally, so it is refused; clients that cannot step are named
in one warning, since personalised methods then report an untrained model for them.
"""

from __future__ import annotations

import logging

import numpy as np

from rayfed.train.settings import TrainConfig
from rayfed.util.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["steps_per_epoch", "check_trainable"]

_NAMED = 5
"""Client ids a warning lists before it only counts the rest."""


def steps_per_epoch(num_train: np.ndarray, train: TrainConfig) -> np.ndarray:
    """Mini-batches each client takes per local epoch: floor(n_i / B) with drop_last, else ceil(n_i / B)."""
    num_train = np.asarray(num_train, dtype=np.int64)
    if train.drop_last:
        return num_train // train.batch_size
    return -(-num_train // train.batch_size)


def check_trainable(num_train: np.ndarray, train: TrainConfig) -> None:
    """Refuse a run in which no client takes a local step; warn once naming the clients that take none.

    ``num_train`` holds each client's training-split size (``Partition.num_train()``).
    """
    stuck = np.flatnonzero(steps_per_epoch(num_train, train) == 0)
    if stuck.size == 0:
        return
    refused = stuck.size == len(num_train)
    largest = int(np.max(num_train))
    # Refused: the batch that lets one client step; warned: the batch that lets every client step.
    bound = largest if refused else int(np.min(num_train))
    if train.drop_last and bound > 0:
        fixes = (
            f"use train.batch_size<={bound}, train.drop_last=false, or fewer clients (data.num_clients) "
            "so that each holds more data"
        )
    else:
        fixes = "give every client data: raise data.min_samples or data.train_fraction, or use fewer clients"
    why = (
        f"hold fewer than train.batch_size={train.batch_size} training samples and train.drop_last=true"
        if train.drop_last
        else "hold no training sample"
    )
    if refused:
        raise ConfigError(
            f"no client can take a local step: all {stuck.size} clients {why} (the largest client trains on "
            f"{largest} samples), so the run would train nothing; {fixes}"
        )
    shown = ", ".join(str(int(c)) for c in stuck[:_NAMED])
    more = f" and {stuck.size - _NAMED} more" if stuck.size > _NAMED else ""
    logger.warning(
        "%d of %d clients (%s%s) %s, so they take no local step (their model is the one the server sends); %s",
        stuck.size,
        len(num_train),
        shown,
        more,
        why,
        fixes,
    )
