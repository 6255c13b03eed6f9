"""Test callbacks that record, after each round, every client's persisted model or the server's state."""

from __future__ import annotations

import numpy as np

from rayfed.engine.callbacks import Callback


class StateSnapshots(Callback):
    """``rounds[t][client_id]``: a copy of the client's state ``"model"`` after round t."""

    def __init__(self) -> None:
        self.rounds: list[dict[int, np.ndarray]] = []

    def after_round(self, sim, record, clients) -> bool:
        self.rounds.append({cid: np.array(sim.states.get(cid)["model"]) for cid in sim.states.ids()})
        return False


class ServerStates(Callback):
    """``rounds[t]``: a copy of the server's state (``state_dict``) after round t."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, np.ndarray]] = []

    def after_round(self, sim, record, clients) -> bool:
        self.rounds.append({k: np.array(v) for k, v in sim.executor.server_state().items()})
        return False
