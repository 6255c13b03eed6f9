"""The ``algorithm`` section of a run's config, and its resolution into the run's two halves.

``algorithm.name`` and ``algorithm.client`` name registered algorithms (:mod:`rayfed.algorithms.registry`);
their params are built into the algorithms' own frozen dataclasses when the section is built, and
:func:`resolve` turns the section, once, into the halves every process builds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rayfed.algorithms.registry import ALGORITHMS, ResolvedAlgorithm
from rayfed.util.config_tree import from_mapping
from rayfed.util.documented import documented, section
from rayfed.util.errors import ConfigError
from rayfed.util.registry import closest
from rayfed.util.validation import check_choice

__all__ = ["AlgorithmConfig", "resolve"]


@section("algorithm")
@dataclass(frozen=True)
class AlgorithmConfig:
    """Which algorithm runs, by registered name, with its own hyper-parameters.

    ``name`` picks the algorithm (its server half and, by default, its client half).
    ``client`` optionally takes the client half of another algorithm, e.g. FedAWA's
    server with FedProx's local objective: ``name="fedawa", client="fedprox"``.
    ``params`` holds the server algorithm's hyper-parameters, ``client_params``
    the other client half's. Both are validated into the algorithm's frozen params
    dataclass at construction, so ``algorithm.params.wdr_lambda`` is a typed field.
    """

    name: str = documented("fedavg", "A registered algorithm (rayfed list): fedavg, fedprox, cwfedavg, fedawa, ...")
    params: Any = documented({}, "The algorithm's own hyper-parameters, e.g. algorithm.params.wdr_lambda (cwfedavg).")
    client: str | None = documented(
        None, "Borrow another algorithm's client half (local objective), e.g. fedprox or sgdm; null = name's own."
    )
    client_params: Any = documented({}, "Hyper-parameters of the borrowed client half (needs client).")

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _build_params(self.name, self.params, "algorithm.params", "name"))
        if self.client is not None:
            check_choice("algorithm.client", self.client, ALGORITHMS.names())
            params = _build_params(self.client, self.client_params, "algorithm.client_params", "client")
            object.__setattr__(self, "client_params", params)
        elif self.client_params:
            raise ConfigError(
                "algorithm.client_params is set but algorithm.client is not; name the algorithm whose client half "
                f"takes them (got algorithm.client_params={dict(self.client_params)!r})"
            )


def _build_params(owner: str, value: Any, path: str, selector: str) -> Any:
    """``value`` as the params dataclass of algorithm ``owner`` (chosen by ``algorithm.{selector}``).

    A key ``owner`` does not take names the algorithms that do take it.
    """
    params_type = ALGORITHMS.get(owner).params_type
    if isinstance(value, params_type):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path} must be a table of {params_type.__name__} fields, but got {path}={value!r}")
    known = _param_names(params_type)
    for key in value:
        if key not in known:
            takers = [name for name in ALGORITHMS if key in _param_names(ALGORITHMS.get(name).params_type)]
            hint = f"; {key} is a parameter of {', '.join(map(repr, takers))}" if takers else closest(str(key), known)
            raise ConfigError(
                f"unknown config key '{path}.{key}': algorithm.{selector}={owner!r} takes "
                f"{', '.join(known) if known else 'no parameters'}{hint}"
            )
    return from_mapping(params_type, value, path)


def _param_names(params_type: type) -> list[str]:
    return [f.name for f in dataclasses.fields(params_type)]


def resolve(config: AlgorithmConfig) -> ResolvedAlgorithm:
    """Turn ``algorithm.*`` into the run's halves; ``algorithm.client`` borrows another's client half."""
    algorithm = ALGORITHMS.get(config.name)
    if config.client is None:
        client_algorithm, client_params = algorithm, config.params
    else:
        client_algorithm, client_params = ALGORITHMS.get(config.client), config.client_params
    return ResolvedAlgorithm(
        algorithm=algorithm,
        server_params=config.params,
        client_params=client_params,
        client_algorithm=client_algorithm,
        keeps_client_state=algorithm.keeps_client_state or client_algorithm.keeps_client_state,
    )
