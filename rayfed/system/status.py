"""What became of a client the server sampled or launched: the client state machine's ends, as small integers.

FLGo's client state machine has the states offline, idle, selected, working and dropped; FedScale's rounds keep
the first finishers of an over-committed sample and drop stragglers. A round records for every client it sampled
one of these outcomes (``int8`` arrays; :data:`STATUS_NAMES` in the per-client files).

>>> STATUS_NAMES[ClientStatus.LATE], counted(np.array([0, 1, 2, 3, 4, 5], dtype=np.int8)).tolist()
('late', [True, True, False, False, False, False])
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

__all__ = ["ClientStatus", "STATUS_NAMES", "counted"]


class ClientStatus(IntEnum):
    FINISHED = 0
    """It trained all its steps and its upload reached the server in time: its work counts."""
    PARTIAL = 1
    """Still training at the deadline, it uploaded the steps it had done (``system.late_work="partial"``)."""
    LATE = 2
    """Its upload would have reached the server after the deadline: its work is dropped."""
    SURPLUS = 3
    """It finished in time, but after the round had the clients it needed (over-commitment): not used."""
    OFFLINE = 4
    """It went offline before its upload reached the server."""
    DROPPED = 5
    """It lost its connection while working (``system.dropout``): nothing reached the server."""


STATUS_NAMES = tuple(status.name.lower() for status in ClientStatus)
"""The name of each status, indexed by its value."""


def counted(status: np.ndarray) -> np.ndarray:
    """Whether each client's work counts in the aggregation (finished, or partial)."""
    return status <= ClientStatus.PARTIAL
