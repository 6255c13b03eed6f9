"""Every method that stacks trains a pack's runs in one merged stack with the numbers each run gives alone.

For each registered method whose capabilities say it stacks (enumerated from the registry: a new one joins by
registering), three runs differ in their seeds (their partitions, initial models and batches), learning rates and
every float hyper-parameter of the method (what its loss reads, WDR's lambda, FedProx's mu, Ditto's lam, and the
server's, in which a pack's runs may differ too: :func:`~rayfed.execution.run_packs.pack_key`). For two rounds, each
run's call trains its clients through its own stacked path alone, and the three calls train again at once, each in a
thread of its own as :func:`rayfed.run_many` runs them, their stacks handed to one
:class:`~rayfed.execution.stack_merger.StackMerger`. Every client's steps, loss and update norm, each run's summed
upload and its clients' new states agree (:func:`~rayfed.checking.path_comparison.path_differences`, the stacked
path's tolerance: a merged stack is a stack of another width), and the merger says it trained the three runs' stacks
as one (for the few methods whose stack has one learning rate or whose hooks read their params, the two runs that
differ in their seed only, the third in a stack of its own: :data:`SAME_RATE_ONLY`). Whole runs packed against alone,
for a few methods, are in tests/packs/test_run_many.py; ``rayfed tune`` trials packed, in tests/tuning.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rayfed.algorithms import ALGORITHMS
from rayfed.checking.method_check import TwoPaths, check_config
from rayfed.checking.path_comparison import path_differences
from rayfed.execution import stack_merger
from rayfed.execution.reports import TrainResult
from rayfed.execution.round_facts import RoundFacts
from rayfed.execution.stack_merger import StackMerger
from tests.train.test_every_method_stacks import OVERRIDES

STACKING = sorted(name for name in ALGORITHMS if ALGORITHMS.get(name).capabilities.stacks)
"""Every registered method whose client half stacks: each is a pack's method here."""
FAST = ("cwfedavg",)
"""The methods the fast lane packs (its loss reads a float of its own, WDR's lambda, of which the merged stack's lanes
each select their own run's); the others are in the slow lane."""
SAME_RATE_ONLY = {
    "apple": "its hooks read its params (mu; dr_lr, the rate of its mixing weights), its core trains at the run's rate",
    "fedclassavg": "Adam: a stack has one learning rate and one epsilon",
    "fednh": "its gradient hook reads its params (max_grad_norm), its scale trains at the run's rate",
}
"""Methods whose stacks merge only with runs of their learning rate and params
(:func:`~rayfed.execution.stack_merger.merge_key`; the runs that differ train in their own stacks of the same call):
of a pack, the two runs that differ in their seed only."""
RUNS = ((0, 1.0, 1.0), (1, 0.5, 0.5), (2, 1.0, 1.0))
"""Each run of a pack: its seed, the factor of its learning rate, and that of each float hyper-parameter (the first
and last runs share their learning rate: a method whose stack has one rate merges those two)."""
CLIENTS = 3
SMALL = {"data.options": {"num_samples": 64}, "train.batch_size": 4}
"""A few steps of a few samples a client: the merging is what is tested, not the method's training."""


def _config(name: str, seed: int, rate: float, factor: float) -> Any:
    """``rayfed check``'s tiny run of ``name`` (with what it needs here), its seed, learning rate scaled by ``rate``
    and every float of its params by ``factor`` (ordered bounds such as CFL's eps1 < eps2 keep their order)."""
    base = check_config(name, {**OVERRIDES.get(name, {}), **SMALL}, clients=CLIENTS)
    params = base.algorithm.params
    values = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    floats = {f"algorithm.params.{key}": value * factor for key, value in values.items() if isinstance(value, float)}
    return base.override({"seed": seed, "train.lr": base.train.lr * rate, **floats})


def _round(paths: TwoPaths, t: int) -> tuple[Any, ...]:
    """The arguments of round ``t``'s call of all of ``paths``' clients: its message, facts, clients and states."""
    config = paths.config
    ctx = RoundFacts(round=t, seed=config.seed, lr=config.train.lr_at(t), sampled=np.arange(CLIENTS))
    return paths.server.broadcast(), ctx, list(range(CLIENTS)), paths.states


def _packed(runs: list[TwoPaths], calls: list[tuple[Any, ...]], merger: StackMerger) -> list[TrainResult]:
    """Each run's call trained at once, each in a thread of its own holding its turn of ``merger``."""
    results: list[Any] = [None] * len(runs)
    errors: list[BaseException] = []
    merger.expect(len(runs))

    def one(index: int) -> None:
        runner = runs[index].stacked
        with merger.turn():
            runner.merger = merger
            try:
                results[index] = runner.train(*calls[index])
            except BaseException as error:  # noqa: BLE001 - raised in the test's thread below
                errors.append(error)
            finally:
                runner.merger = None

    threads = [threading.Thread(target=one, args=(index,)) for index in range(len(runs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def selected(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The losses a merged stack computed for runs whose losses differ in their hyper-parameters, as they happen
    (one entry a call of :class:`~rayfed.execution.stack_merger._SelectedLoss`: the number of runs' losses)."""
    calls: list[int] = []
    select = stack_merger._SelectedLoss.__call__

    def counted(self: Any, *args: Any) -> Any:
        calls.append(len(self.losses))
        return select(self, *args)

    monkeypatch.setattr(stack_merger._SelectedLoss, "__call__", counted)
    return calls


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in STACKING])
def test_a_pack_of_runs_trains_in_one_stack_with_the_numbers_of_each_run_alone(
    name: str, tmp_path: Path, selected: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    torch.set_num_threads(1)
    caplog.set_level(logging.INFO, logger=stack_merger.__name__)
    # Prepare: three runs of the method, of other seeds, learning rates and hyper-parameters (each its stacked
    # runner and its server).
    runs = [TwoPaths(_config(name, *run), tmp_path / f"run-{run[0]}") for run in RUNS]
    merger = StackMerger()
    for t in range(2):
        calls = [_round(paths, t) for paths in runs]
        # Execute: each run's call alone, then the three at once through one merger.
        alone = [paths.stacked.train(*call) for paths, call in zip(runs, calls)]
        merged_before = merger.merged
        packed = _packed(runs, calls, merger)
        # Assert: every client's numbers, each run's upload and states, as alone; the three stacks trained as one.
        for paths, one, other in zip(runs, alone, packed):
            assert path_differences(one, other) == [], (t, paths.config.seed)
        assert merger.merged - merged_before == (2 if name in SAME_RATE_ONLY else len(runs)), t
        for paths, call, one in zip(runs, calls, alone):
            paths.states.update(one.states)
            paths.server.aggregate(call[1], one.contribution)
    assert merger.live == 0
    apart = [r.getMessage() for r in caplog.records if "train apart" in r.getMessage()]
    assert len(apart) == (1 if name in SAME_RATE_ONLY else 0), apart  # why, said once for the two rounds
    if name in FAST:  # the merged stack's lanes each kept their own run's loss, of its own hyper-parameter
        assert selected, name


def test_the_methods_said_to_merge_less_are_methods_that_stack() -> None:
    assert set(SAME_RATE_ONLY) | set(FAST) <= set(STACKING)
