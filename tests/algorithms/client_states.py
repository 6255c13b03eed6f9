"""Test callbacks that record, after each round, every client's persisted model or the server's state."""

from __future__ import annotations

import numpy as np

from rayfed.engine.callbacks import Callback


class StateSnapshots(Callback):
    """``rounds[t][client_id]``: a copy of the client's state ``"model"`` after round t."""

    def __init__(self) -> None:
        self.rounds: list[dict[int, np.ndarray]] = []

    def after_round(self, run, record, clients) -> bool:
        self.rounds.append({cid: np.array(state["model"]) for cid, state in run.client_states()})
        return False


class ServerStates(Callback):
    """``rounds[t]``: a copy of the server's state (``state_dict``) after round t."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, np.ndarray]] = []

    def after_round(self, run, record, clients) -> bool:
        self.rounds.append({k: np.array(v) for k, v in run.server_state().items()})
        return False
