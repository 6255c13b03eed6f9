"""Folding a round's sums along the nodes that hold them (``rayfed.actors.folding``): which runs fold, that the
folded total is the server's left-to-right sum bit for bit, and that a failed fold leaves the server the parts."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rayfed import RunConfig
from rayfed.actors.folding import fetches_folded, fetches_unfolded, fold_runs, runs_of
from rayfed.algorithms import WeightedSum, sum_contributions
from rayfed.algorithms.contributions import ClientVectors
from rayfed.engine import Simulation
from rayfed.engine.callbacks import Callback
from tests.conftest import tiny_overrides


def test_runs_are_the_stretches_of_consecutive_calls_on_one_node() -> None:
    assert runs_of(["a", "a", "b", "b", "b", "a"]) == [range(0, 2), range(2, 5), range(5, 6)]
    assert runs_of(["a"]) == [range(0, 1)]
    assert runs_of([]) == []


@pytest.mark.parametrize(
    ("nodes", "unfolded", "folded", "runs"),
    [
        (["b"] * 8, 8, 1, [range(0, 8)]),  # one worker node: one object reaches the server, not 8
        (["b"] * 4 + ["c"] * 4, 8, 2, [range(0, 4), range(4, 8)]),
        (["s", "s", "b", "b", "b"], 3, 2, [range(0, 2), range(2, 5)]),  # b fetches s's total, the server b's
        (["s", "s", "b", "b"], 2, 2, None),
        (["b", "c", "b", "c"], 4, 4, None),  # interleaved: folding would fetch as many objects
        (["s"] * 4, 0, 0, None),  # everything on the server's node: nothing to save
        (["b", "s"], 1, 1, None),
    ],
)
def test_fold_only_where_fewer_objects_cross_nodes(nodes, unfolded, folded, runs) -> None:
    assert fetches_unfolded(nodes, "s") == unfolded
    assert fetches_folded(nodes, "s") == folded
    assert fold_runs(nodes, "s", sums_are_one_part=True) == runs


def test_concatenated_uploads_are_never_folded() -> None:
    # Each hop would carry every client's row so far: the server fetches the calls' parts itself.
    assert fold_runs(["b"] * 8, "s", sums_are_one_part=False) is None
    assert WeightedSum.sum_is_one_part and not ClientVectors.sum_is_one_part


class _FoldAfterRound(Callback):
    """After the only round, folds five sums on the live pool, then kills the folding worker and folds again."""

    def __init__(self) -> None:
        self.simulation: Simulation | None = None
        self.parts: list[WeightedSum] = []
        self.folded: list[object] = []
        self.unfolded: list[object] = []
        self.refs: list[object] = []

    def after_round(self, run, record, clients) -> bool:
        import ray

        pool = self.simulation.executor.pool  # type: ignore[union-attr]
        rng = np.random.default_rng(0)
        self.parts = [WeightedSum.of(rng.standard_normal(1000).astype(np.float32), w) for w in (3, 1, 4, 1, 5)]
        self.refs = [ray.put(part) for part in self.parts]
        node = ray.get(pool.workers[0].node_and_pid.remote())[0]
        runs = [range(0, 2), range(2, 5)]
        self.folded = ray.get(pool.fold(runs, self.refs, [node] * 5, record.round))
        ray.kill(pool.workers[0], no_restart=True)  # the worker fold picks on that node (lowest slot)
        self.unfolded = pool.fold(runs, self.refs, [node] * 5, record.round)
        return False


@pytest.mark.timeout(180)
def test_folded_total_is_the_left_to_right_sum_and_a_failed_fold_leaves_the_parts(
    tmp_path, ray_cluster, caplog
) -> None:
    # Prepare: a one-round Ray run whose callback folds five sums in two runs on the pool's first worker.
    config = RunConfig().override(
        tiny_overrides(tmp_path, **{"train.rounds": 1, "engine.backend": "ray", "engine.num_workers": 1})
    )
    callback = _FoldAfterRound()
    callback.simulation = Simulation(config, callbacks=[callback])
    # Execute
    with caplog.at_level(logging.WARNING, logger="rayfed"):
        callback.simulation.run()
    # Check: one object, equal to the server's own sum to the last bit (the same additions in the same order).
    (folded,) = callback.folded
    expected = sum_contributions(callback.parts)
    assert folded.total.tobytes() == expected.total.tobytes()
    assert (folded.weight, folded.count) == (expected.weight, expected.count) == (14.0, 5)
    # Check: with the folding worker gone, the server is handed every part, and the log says so.
    assert callback.unfolded == callback.refs
    assert "round 0: folding the sums of calls 0-4 failed" in caplog.text
