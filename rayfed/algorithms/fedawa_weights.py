"""Named initial aggregation weights for FedAWA (``algorithm.params.initial_weights``).

Shi et al., "FedAWA: Adaptive Optimization of Aggregation Weights in Federated Learning
Using Client Vectors", CVPR 2025: Alg. 1 starts from λ⁰_k = |D_k| / Σ_i |D_i| and refines
the weights round after round; Sec. 5.3 ("Modularity") starts instead from another
method's weights (FedDisco's) and refines those. An initialiser is that starting point:
a function of the clients' ids, their training sizes, their training-label counts (or
``None``) and the :class:`ProblemSpec` that returns one positive weight per client. A module
that brings a new one (FedDisco, :mod:`rayfed.algorithms.feddisco`) calls
:func:`register_initial_weights` and FedAWA accepts its name. An initialiser that reads the
label counts says so (``needs_label_counts=True``); FedAWA's clients then upload their
label histogram (K integers) beside their client vector, and only then.

The server asks for the weights of the clients it sees in a round, the first time it sees
them. Under full participation they are all the clients, and a weight should be the
client's share of the population; under partial participation it is an estimate of it
(the weights of different rounds must be comparable, since they are kept by client id).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rayfed.algorithms.registry import ALGORITHMS
from rayfed.train.problem import ProblemSpec
from rayfed.util.registry import Registry, caller_module

__all__ = [
    "InitialWeights",
    "INITIAL_WEIGHTS",
    "register_initial_weights",
    "needs_label_counts",
    "size_weights",
    "uniform_weights",
]

InitialWeights = Callable[[np.ndarray, np.ndarray, "np.ndarray | None", ProblemSpec], np.ndarray]
"""(client ids (M,), their training sizes (M,), their label counts (M, K) or None, spec) -> their
weights (M,), each ≥ 0, about 1/N each on average."""


def _import_providers(name: str | None) -> None:
    """Initialisers are registered by the algorithm modules that bring them (FedDisco's): import every one,
    so that a name is known in any process, whatever it imported before."""
    ALGORITHMS.names()


INITIAL_WEIGHTS: Registry[InitialWeights] = Registry(
    "initial weights", field="algorithm.params.initial_weights", load=_import_providers
)

_READS_LABEL_COUNTS: set[str] = set()


def register_initial_weights(
    name: str, *, needs_label_counts: bool = False
) -> Callable[[InitialWeights], InitialWeights]:
    """Decorator: make ``name`` a choice of ``algorithm.params.initial_weights``; with
    ``needs_label_counts`` the clients must upload their label histograms for it."""
    if needs_label_counts:
        _READS_LABEL_COUNTS.add(name)
    return INITIAL_WEIGHTS.register(name, origin=caller_module())


def needs_label_counts(name: str) -> bool:
    """True if the initialiser ``name`` reads the clients' label counts (so they must be uploaded)."""
    return name in _READS_LABEL_COUNTS


@register_initial_weights("size")
def size_weights(
    client_ids: np.ndarray, sizes: np.ndarray, label_counts: np.ndarray | None, spec: ProblemSpec
) -> np.ndarray:
    """λ⁰_k = n_k / Σ_i n_i (Alg. 1, line 1), estimated from the clients at hand as
    n_k / (N · mean of their n): exact when they are all N clients."""
    return np.asarray(sizes, np.float64) / (spec.num_clients * max(float(np.mean(sizes)), 1e-12))


@register_initial_weights("uniform")
def uniform_weights(
    client_ids: np.ndarray, sizes: np.ndarray, label_counts: np.ndarray | None, spec: ProblemSpec
) -> np.ndarray:
    """λ⁰_k = 1 / N."""
    return np.full(len(client_ids), 1.0 / spec.num_clients)
