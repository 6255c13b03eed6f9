"""The server state of the clustered methods (CFL, IFCA): one model per cluster and each client's cluster."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["ClusterModelState"]


class ClusterModelState:
    """Mixin for a :class:`~rayfed.algorithms.hooks.ServerHalf` that keeps cluster models and an assignment.

    It saves and restores both arrays for checkpoints; the server decides what they mean
    (CFL: the cluster a client belongs to; IFCA: the cluster it last chose, -1 = never).
    """

    models: np.ndarray
    """(C, S) float32: cluster j's state vector in row j."""
    assignment: np.ndarray
    """(M,) int64: a cluster index per client."""

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"models": self.models, "assignment": self.assignment}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.models = np.array(state["models"], dtype=np.float32)
        self.assignment = np.array(state["assignment"], dtype=np.int64)
