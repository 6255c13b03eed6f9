"""A test callback that records every client's persisted model after each round."""

from __future__ import annotations

import numpy as np

from rayfed.callbacks import Callback


class StateSnapshots(Callback):
    """``rounds[t][client_id]``: a copy of the client's state ``"model"`` after round t."""

    def __init__(self) -> None:
        self.rounds: list[dict[int, np.ndarray]] = []

    def after_round(self, sim, record, clients) -> bool:
        self.rounds.append({cid: np.array(sim.states.get(cid)["model"]) for cid in sim.states.ids()})
        return False
