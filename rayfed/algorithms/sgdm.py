"""SGD-momentum clients whose momentum buffers persist across rounds (FedAWA's clients).

In the FedAWA code (P-AWA App. A.5; docs/algorithms.md, "SGD with persistent momentum (sgdm)") every client creates its
``SGD(lr, momentum=0.9, weight_decay=5e-4)`` optimiser once, at start-up, and loads the
global model into its network each round: the model is replaced, the momentum buffer is
not. Round t of client k therefore starts from θ_g^t with the buffer b_k left by its
previous round, and runs the usual torch SGD update (dampening 0, no Nesterov)::

    g ← ∇L(w) + wd·w,    b_k ← m·b_k + g,    w ← w − lr·b_k

Momentum and weight decay are ``train.momentum`` and ``train.weight_decay``. The buffer
(P floats) is kept in the client state store under ``"momentum"``, so it survives
worker restarts and checkpoints. With ``train.momentum = 0`` nothing is kept and
this is the plain client.

The client half is FedAWA's default; here it is also registered as ``"sgdm"`` with
FedAvg's server, for the FedAvg baseline of the FedAWA paper and for borrowing
(``algorithm.name="fedawa_l", algorithm.client="sgdm"``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayfed.algorithms.common.global_model import GlobalModel, GlobalModelClient
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.algorithms.hooks import NoParams
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.algorithms.sizing import StateSizes, momentum_bytes
from rayfed.train.job import ClientJob
from rayfed.train.phase import SGD, Phase
from rayfed.train.problem import ProblemSpec

if TYPE_CHECKING:
    from rayfed.train.settings import TrainConfig

__all__ = ["PersistentMomentumClient", "SGDMServer", "MOMENTUM_KEY"]

MOMENTUM_KEY = "momentum"
"""Name of the momentum buffer in the client's state."""


class PersistentMomentumClient(GlobalModelClient[Any, GlobalModel]):
    """FedAvg's client whose local SGD carries its momentum buffer from one round of the client to its next."""

    def phases(self, message: GlobalModel, job: ClientJob) -> list[Phase]:
        return [Phase(epochs=job.train.local_epochs, optimizer=SGD(keep_momentum=MOMENTUM_KEY))]


class SGDMServer(StateSizes, FedAvgServer[NoParams]):
    """FedAvg's server, for clients that keep their momentum buffers."""

    @classmethod
    def client_state_bytes(cls, params: object, spec: ProblemSpec, train: TrainConfig) -> int:
        return momentum_bytes(spec, train)


register_algorithm(
    "sgdm",
    params=NoParams,
    server=SGDMServer,
    client=PersistentMomentumClient,
    summary="FedAvg with SGD-momentum clients whose buffers persist across rounds (FedAWA's clients)",
    keeps_client_state=True,
    reporting=Reporting(label="FedAvg (SGDM)", single_model=True),
)
