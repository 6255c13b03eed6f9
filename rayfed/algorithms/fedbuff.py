"""FedBuff: buffered asynchronous aggregation.

Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek and Huba, "Federated Learning with Buffered Asynchronous
Aggregation", AISTATS 2022, arXiv:2106.06639 (Algorithm 1). See docs/system.md, "Asynchronous aggregation".

C clients train at once (the concurrency), each from the model version of its launch; the server adds every update
that arrives to its buffer, and once it holds K (the buffer size) it takes one step:

    Δ_k = θ_{τ_k} − y_k                           client k's update: its start minus its trained model
    Δ̄ = (1/K) Σ_k s(t − τ_k) Δ_k                  staleness-weighted (the paper's experiments: s = 1/√(1 + t − τ))
    θ_{t+1} = θ_t − η_g Δ̄                         η_g the server learning rate

K is the number of updates in the step (the buffer size, fewer only when an update was rejected as not finite or
beyond ``engine.max_update_norm``). Floating-point buffers (BatchNorm statistics) take the same step. With K = C,
no staleness and η_g = 1, a step is the unweighted mean of the clients' models. The schedule (who trains when,
each update's staleness) is simulated in virtual time by the engine (:mod:`rayfed.scheduling.async_rounds`) and the
server keeps each update until its step (:mod:`rayfed.algorithms.common.asynchronous`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.algorithms.common.asynchronous import AsynchronousParams, KeptUpdatesServer
from rayfed.algorithms.common.global_model import WholeModelsClient
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.util.documented import documented, section
from rayfed.util.validation import check_int, check_real

__all__ = ["FedBuffParams", "FedBuffServer"]


@section("algorithm.params")
@dataclass(frozen=True)
class FedBuffParams(AsynchronousParams):
    """Hyper-parameters of FedBuff (``algorithm.params.*``)."""

    buffer_size: int = documented(
        5, "K, the updates the server buffers before it steps (the paper's K = 10 with C in the hundreds); <= C."
    )
    server_lr: float = documented(1.0, "η_g, the server learning rate of the step θ ← θ − η_g Δ̄.")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("algorithm.params.buffer_size", self.buffer_size, low=1)
        check_real("algorithm.params.server_lr", self.server_lr, low=0, low_open=True)

    @property
    def buffer(self) -> int:
        return self.buffer_size


class FedBuffServer(KeptUpdatesServer[FedBuffParams]):
    """Keeps θ_g and the buffered, staleness-weighted deltas of each version to make."""

    def update_of(self, models: np.ndarray) -> np.ndarray:
        """Δ_k = θ_τ − y_k, from the θ_τ the clients were launched from (the current one)."""
        return self.global_vector[None, :] - models

    def apply(self, total: np.ndarray, weight: float, count: int) -> dict[str, float]:
        step = (total / np.float32(count)).astype(np.float32)
        self.global_vector = (self.global_vector - np.float32(self.params.server_lr) * step).astype(np.float32)
        return {"fedbuff_delta_norm": float(np.linalg.norm(step)), "fedbuff_mean_weight": weight / count}


register_algorithm(
    "fedbuff",
    params=FedBuffParams,
    server=FedBuffServer,
    client=WholeModelsClient,
    summary="FedBuff (Nguyen et al. 2022): asynchronous clients, a server step per K staleness-weighted updates",
    reporting=Reporting(label="FedBuff", single_model=True),
)
