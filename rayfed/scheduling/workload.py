"""A system model's workload: what each client's round costs on its device, found from its method's own work.

The virtual clock (docs/system.md, Eq. 1) charges a client the steps of every phase its method gives it (every
epoch of every phase: FedRep's head and body epochs, Ditto's personal and global phases) and the bytes of the
method's own messages each way (what the per-client files record as ``bytes_down`` and ``bytes_up``: FedPer's and
FedRep's bodies, FedAWA's client vectors). :func:`method_workload` finds both before the run, on this process, from
the method's first round: for each architecture, one of its clients (the one with the most training samples)
builds its phases from the server's first message without training them, which gives the steps each of the
architecture's clients draws for its own training samples, over all its phases and over those a deadline's step
budget covers (``Phase.budgeted``); and it trains once with a step budget of 0 (only the phases the budget does
not cover step), which gives the bytes of its download and its upload.

A method whose work changes from round to round declares it (:class:`~rayfed.algorithms.declarations.VaryingWork`:
KT-pFL's distillation on the public set, which begins in its second round, and its ramp of local epochs
``max_local_epochs``; FedClassAvg's warm-up epoch, which a client trains in its first round only; the downloads of
FedFomo, APPLE and KT-pFL, whose first message carries no other client's model and whose later ones depend on what
the client holds, and of FedProto, whose first message carries no prototype). Its :class:`RoundWork` then finds each
round's work from that round's own message and each sampled client's state, before the round is timed: every sampled
client is started (by the method's cheapest start of the same phases and download, ``VaryingWork.work_start``) and
its phases built, without training; its upload keeps the first round's size. Nothing is trained on this process, and
the work of the other methods, whose rounds are alike, is found once. The per-client files show what each client was
charged beside what it trained and moved (``charged_steps``, ``trained_steps``; ``charged_bytes_down``,
``bytes_down``): equal, round by round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from rayfed.algorithms import ResolvedAlgorithm
from rayfed.algorithms.declarations import varies_work
from rayfed.config import RunConfig
from rayfed.engine.inputs import RunInputs
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.round_facts import RoundFacts
from rayfed.privacy.secure_aggregation import overhead_bytes
from rayfed.system import Workload
from rayfed.system.rounds import round_sizes
from rayfed.train.job import ClientState

__all__ = ["method_workload", "RoundWork", "ClientStates"]

ClientStates = Callable[[np.ndarray], Mapping[int, ClientState]]
"""The states the round loop's store holds of some clients (those it holds none of are left out)."""


def method_workload(
    config: RunConfig, algorithm: ResolvedAlgorithm, inputs: RunInputs
) -> tuple[Workload, RoundWork | None]:
    """Each client's round under ``config``'s method: the steps of all its phases and of those a step budget
    covers, and the bytes it downloads and uploads, in the first round; and, for a method whose work changes by
    round, what finds each round's (module docstring)."""
    spec, num_clients = inputs.spec, config.data.num_clients
    sizes = np.asarray(inputs.partition.num_train(), dtype=np.int64)
    architectures = np.array([spec.architecture_of(i) for i in range(num_clients)], dtype=object)
    runner = ClientRunner(config, spec, inputs.dataset, inputs.partition)
    message = algorithm.make_server(spec, inputs.initial).broadcast()
    steps, budgeted = np.zeros(num_clients, np.int64), np.zeros(num_clients, np.int64)
    down, up = np.zeros(num_clients), np.zeros(num_clients)
    for architecture in dict.fromkeys(architectures.tolist()):
        members = np.flatnonzero(architectures == architecture)
        probe = int(members[np.argmax(sizes[members])])
        ctx = RoundFacts(round=0, seed=config.seed, lr=config.train.lr_at(0), sampled=np.array([probe]))
        steps[members], budgeted[members] = runner.work_steps(message, ctx, probe, sizes[members])
        untrained = RoundFacts(ctx.round, ctx.seed, ctx.lr, ctx.sampled, step_budget=np.zeros(1, np.int64))
        (report,) = runner.train(message, untrained, [probe]).reports
        down[members], up[members] = report.bytes_down, report.bytes_up
    first = _with_secure_aggregation(config, Workload(steps, down, up, budgeted))
    return first, RoundWork(config, runner, first) if varies_work(runner.client_half) else None


def _with_secure_aggregation(config: RunConfig, work: Workload) -> Workload:
    """``work`` with ``privacy.secure_aggregation``'s bytes added to every upload
    (:func:`rayfed.privacy.secure_aggregation.overhead_bytes`, docs/privacy.md), for an instance of the
    ⌊n · over_commit⌋ clients a round samples."""
    protocol = config.privacy.secure_aggregation
    if protocol == "off":
        return work
    drawn = round_sizes(config.data.num_clients, config.engine.join_ratio, config.system.over_commit)[1]
    extra = overhead_bytes(protocol, drawn, work.bytes_up, config.privacy.secagg_neighbours)
    return replace(work, bytes_up=work.bytes_up + extra)


class RoundWork:
    """Each round's workload of a method whose work changes by round (module docstring): ``first``, the first
    round's, with the sampled clients' steps and downloads found from the round's message and their states."""

    def __init__(self, config: RunConfig, runner: ClientRunner, first: Workload) -> None:
        self.config, self.runner, self.first = config, runner, first

    def of(self, round_index: int, ids: np.ndarray, message: Any, states: ClientStates) -> Workload:
        """The workload of round ``round_index`` whose clients ``ids`` start from ``message`` and their states."""
        ids = np.asarray(ids, dtype=np.int64)
        config = self.config
        ctx = RoundFacts(round=round_index, seed=config.seed, lr=config.train.lr_at(round_index), sampled=ids)
        steps, budgeted, down = self.runner.round_work(message, ctx, dict(states(ids)))
        work = self.first
        every, covered = work.steps.copy(), work.budgeted_of(np.arange(len(work.steps))).copy()
        downloads = np.broadcast_to(np.asarray(work.bytes_down, dtype=np.float64), every.shape).copy()
        every[ids], covered[ids], downloads[ids] = steps, budgeted, down
        return replace(work, steps=every, budgeted=covered, bytes_down=downloads)
