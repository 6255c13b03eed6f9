"""Per-client state for algorithms whose clients remember something between rounds.

FedClassAvg keeps each client's backbone, FedAWA's clients keep an SGD momentum
buffer, local-only baselines keep a whole model. :class:`ClientStateStore` holds these
on the driver, in memory up to ``memory_bytes``; beyond that the least recently used
states spill to ``.npz`` files in ``spill_dir`` and come back on demand. Algorithms
that keep no per-client state (FedAvg, cwFedAvg) never touch it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from rayfed.train.job import ClientState
from rayfed.util.files import load_arrays, save_arrays

__all__ = ["ClientStateStore"]


class ClientStateStore:
    """Client id -> named arrays, memory-bounded with spill to disk.

    >>> import tempfile
    >>> store = ClientStateStore(tempfile.mkdtemp(), memory_bytes=16)
    >>> store.put(0, {"w": np.zeros(4, np.float32)}); store.put(1, {"w": np.ones(4, np.float32)})
    >>> store.spilled_ids(), float(store.get(0)["w"].sum())
    ([0], 0.0)
    """

    def __init__(self, spill_dir: str | Path, memory_bytes: int) -> None:
        self.spill_dir = Path(spill_dir)
        self.memory_bytes = memory_bytes
        self._memory: OrderedDict[int, ClientState] = OrderedDict()
        self._used = 0
        self._spilled: set[int] = set()

    def __len__(self) -> int:
        return len(self._memory) + len(self._spilled)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._memory or client_id in self._spilled

    def ids(self) -> Iterator[int]:
        yield from sorted([*self._memory, *self._spilled])

    def spilled_ids(self) -> list[int]:
        return sorted(self._spilled)

    @property
    def bytes_in_memory(self) -> int:
        return self._used

    def put(self, client_id: int, state: ClientState) -> None:
        self._drop(client_id)
        self._memory[client_id] = {k: np.asarray(v) for k, v in state.items()}
        self._used += _nbytes(self._memory[client_id])
        self._evict()

    def get(self, client_id: int) -> ClientState | None:
        if client_id in self._memory:
            self._memory.move_to_end(client_id)
            return self._memory[client_id]
        if client_id in self._spilled:
            state = load_arrays(self._path(client_id))
            self.put(client_id, state)
            return state
        return None

    def get_many(self, client_ids: Iterable[int]) -> dict[int, ClientState]:
        out = {}
        for cid in client_ids:
            state = self.get(int(cid))
            if state is not None:
                out[int(cid)] = state
        return out

    def clear(self) -> None:
        for cid in list(self._spilled):
            self._path(cid).unlink(missing_ok=True)
        self._memory.clear()
        self._spilled.clear()
        self._used = 0

    def _drop(self, client_id: int) -> None:
        if client_id in self._memory:
            self._used -= _nbytes(self._memory.pop(client_id))
        if client_id in self._spilled:
            self._spilled.discard(client_id)
            self._path(client_id).unlink(missing_ok=True)

    def _evict(self) -> None:
        while self._used > self.memory_bytes and len(self._memory) > 1:
            cid, state = self._memory.popitem(last=False)
            self._used -= _nbytes(state)
            save_arrays(self._path(cid), state)
            self._spilled.add(cid)

    def _path(self, client_id: int) -> Path:
        return self.spill_dir / f"client_{client_id:07d}.npz"


def _nbytes(state: ClientState) -> int:
    return sum(int(v.nbytes) for v in state.values())
