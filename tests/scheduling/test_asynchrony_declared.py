"""What makes a method asynchronous is the one declaration its server half makes
(:class:`~rayfed.algorithms.declarations.AsynchronousAggregation`), which the engine reads: not its params' type."""

from __future__ import annotations

import dataclasses

from rayfed.algorithms import ResolvedAlgorithm, resolve
from rayfed.algorithms.common.asynchronous import AsynchronousParams
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.config import RunConfig
from rayfed.scheduling.system_setup import is_asynchronous


def _resolved(name: str, **params: object) -> ResolvedAlgorithm:
    return resolve(RunConfig().override({"algorithm.name": name, **params}).algorithm)


def test_fedasync_and_fedbuff_are_asynchronous_by_their_server_halves_declaration() -> None:
    assert is_asynchronous(_resolved("fedbuff")) and is_asynchronous(_resolved("fedasync"))
    assert not is_asynchronous(_resolved("fedavg"))
    fedbuff = _resolved("fedbuff", **{"algorithm.params.concurrency": 7, "algorithm.params.buffer_size": 3})
    assert fedbuff.algorithm.server_half.schedule(fedbuff.server_params) == (7, 3)


def test_params_of_the_asynchronous_type_alone_do_not_make_a_method_asynchronous() -> None:
    # Prepare: FedAvg's server half (no declaration) given the asynchronous methods' params
    fedavg = _resolved("fedavg")
    algorithm = dataclasses.replace(fedavg.algorithm, params_type=AsynchronousParams, server_half=FedAvgServer)
    resolved = dataclasses.replace(fedavg, algorithm=algorithm, server_params=AsynchronousParams())
    # Execute, Assert
    assert not is_asynchronous(resolved)
