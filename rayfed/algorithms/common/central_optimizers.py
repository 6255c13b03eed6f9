"""Central optimisers: how a server with one global model moves it by the round's pseudo-gradient.

FedOpt (Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan, "Adaptive Federated Optimization",
ICLR 2021, arXiv:2003.00295, Algorithm 2) writes FedAvg's server as an optimiser step: with θ_{t−1} the global
parameters and Δ_t = (the clients' weighted average) − θ_{t−1} the pseudo-gradient, the server steps
θ_t = ServerOpt(θ_{t−1}, Δ_t). FedAvg is the step θ_t = θ_{t−1} + Δ_t; a server half that names one of these
(:meth:`~rayfed.algorithms.fedavg.FedAvgServer.central_optimizer`) takes another, and its state (the moments)
is saved and restored with the server's. They act on the parameters; the buffers (BatchNorm statistics) take the
clients' average.

Plain numpy on float32 arrays: the server process imports no torch.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

__all__ = ["CentralOptimizer", "CentralSGD", "CentralAdam", "adam_server_step"]


class CentralOptimizer(abc.ABC):
    """A server optimiser over ``size`` parameters, with the state it keeps between rounds."""

    name: ClassVar[str]
    """The method it makes of FedAvg (``fedadam``): the server's metrics of it are named after it."""

    @abc.abstractmethod
    def step(self, theta: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """θ_t (float32) from θ_{t−1} and the pseudo-gradient Δ_t; the optimiser's state moves on."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, np.ndarray]:
        """Its state, saved with the server's (names that are not the server's own)."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` returned."""


class CentralSGD(CentralOptimizer):
    """SGD with momentum on the server: FedAvgM (Hsu, Qi and Brown, "Measuring the Effects of Non-Identical
    Data Distribution for Federated Visual Classification", arXiv:1909.06335, its server momentum written with
    the pseudo-gradient Δ = average − θ and a server learning rate η):

        v_t = β v_{t−1} + Δ_t
        θ_t = θ_{t−1} + η v_t

    η = 1, β = 0 is FedAvg's step (up to float rounding: θ + (average − θ))."""

    name = "fedavgm"

    def __init__(self, size: int, lr: float = 1.0, momentum: float = 0.0) -> None:
        self.lr, self.momentum = lr, momentum
        self.velocity = np.zeros(size, np.float32)

    def step(self, theta: np.ndarray, delta: np.ndarray) -> np.ndarray:
        self.velocity = (self.momentum * self.velocity + delta).astype(np.float32)
        return (theta + self.lr * self.velocity).astype(np.float32)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"velocity": self.velocity}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.velocity = np.array(state["velocity"], dtype=np.float32)


def adam_server_step(
    theta: np.ndarray,
    delta: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    lr: float,
    beta1: float,
    beta2: float,
    tau: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One FedAdam update (Algorithm 2, no bias correction): returns (θ_t, m_t, v_t) from θ_{t−1}, Δ_t, m_{t−1},
    v_{t−1}::

        m_t = β1 m_{t−1} + (1 − β1) Δ_t
        v_t = β2 v_{t−1} + (1 − β2) Δ_t²
        θ_t = θ_{t−1} + η m_t / (√v_t + τ)
    """
    m = beta1 * m + (1 - beta1) * delta
    v = beta2 * v + (1 - beta2) * delta * delta
    theta = theta + lr * m / (np.sqrt(v) + tau)
    return theta.astype(np.float32), m.astype(np.float32), v.astype(np.float32)


class CentralAdam(CentralOptimizer):
    """Adam on the server without bias correction, m_0 = v_0 = 0 (FedAdam, Reddi et al. 2021, Algorithm 2):
    :func:`adam_server_step`; τ is the adaptivity constant added to √v."""

    name = "fedadam"

    def __init__(self, size: int, lr: float, beta1: float, beta2: float, tau: float) -> None:
        self.lr, self.beta1, self.beta2, self.tau = lr, beta1, beta2, tau
        self.m = np.zeros(size, np.float32)
        self.v = np.zeros(size, np.float32)

    def step(self, theta: np.ndarray, delta: np.ndarray) -> np.ndarray:
        theta, self.m, self.v = adam_server_step(
            theta, delta, self.m, self.v, self.lr, self.beta1, self.beta2, self.tau
        )
        return theta

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"m": self.m, "v": self.v}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.m = np.array(state["m"], dtype=np.float32)
        self.v = np.array(state["v"], dtype=np.float32)
