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

A method whose work changes from round to round is charged its first round's: KT-pFL's distillation on the public
set, which begins in its second round, and its ramp of local epochs (``max_local_epochs``); FedClassAvg's warm-up
epoch, which a client trains in its first round only; the downloads of FedFoMo, APPLE and KT-pFL, whose first
message carries no other client's model. The per-client files show what each client was charged beside what it
trained and moved (``charged_steps``, ``trained_steps``; ``charged_bytes_down``, ``bytes_down``).
"""

from __future__ import annotations

import numpy as np

from rayfed.algorithms import ResolvedAlgorithm
from rayfed.config import RunConfig
from rayfed.engine.inputs import RunInputs
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.round_facts import RoundFacts
from rayfed.system import Workload

__all__ = ["method_workload"]


def method_workload(config: RunConfig, algorithm: ResolvedAlgorithm, inputs: RunInputs) -> Workload:
    """Each client's round under ``config``'s method: the steps of all its phases and of those a step budget
    covers, and the bytes it downloads and uploads (module docstring)."""
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
    return Workload(steps, down, up, budgeted)
