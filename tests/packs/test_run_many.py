"""``rayfed.run_many``: runs that share a model share one stack, and each gives the rounds it gives alone.

Whole runs here for two methods (a loss that reads a float of its own, and a personal head);
tests/packs/test_packed_stacks.py holds every method that stacks to the same, call by call.

Each pack's runs differ in their seeds (their partitions, samples and initial models), learning rates and the
hyper-parameters their losses read; the merger's count of stacks trained with another run's says that they really
shared stacks. A run that fails, in the merged stack or in its own driver, leaves the others to finish with their
numbers; a pack whose driver is SIGKILLed resumes to the numbers of its runs uninterrupted.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import rayfed
from rayfed.algorithms.fedprox import FedProxClient
from rayfed.config import RunConfig
from rayfed.engine.callbacks import Callback
from rayfed.execution import stack_merger
from rayfed.execution.run_packs import pack_runs
from tests.packs.pack_configs import (
    alone_config,
    assert_same_numbers,
    driver_past_round_0,
    pack_configs,
    pack_overrides,
    rounds_of,
    run_config,
)


@pytest.fixture
def merged(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the groups of runs' stacks trained as one (the merger's merges, as they happen)."""
    sizes: list[int] = []
    merge = stack_merger.StackMerger._merge

    def counted(self: stack_merger.StackMerger, group: list[Any]) -> bool:
        done = merge(self, group)
        if done:
            sizes.append(len(group))
        return done

    monkeypatch.setattr(stack_merger.StackMerger, "_merge", counted)
    return sizes


@pytest.mark.slow
@pytest.mark.parametrize("method", ["cwfedavg", "fedrep"])
def test_a_packed_run_gives_the_rounds_it_gives_alone(tmp_path: Path, method: str, merged: list[int]) -> None:
    configs = pack_configs(tmp_path, method)
    results = rayfed.run_many(configs)
    assert merged and max(merged) == 3  # the three runs trained their stacks as one
    for config, result in zip(configs, results):
        assert Path(result.run_dir) == Path(config.run_dir)
        rayfed.run(alone_config(config))
        assert_same_numbers(config.run_dir, alone_config(config).run_dir)


def test_runs_that_cannot_pack_run_alone_and_the_log_says_why_in_one_line(tmp_path: Path, caplog: Any) -> None:
    configs = [
        run_config(tmp_path / "a", "fedavg", 0, 0.01, **{"engine.vectorize": "off"}),
        run_config(tmp_path / "b", "fedavg", 1, 0.01, **{"model.name": "cnn5"}),
        run_config(tmp_path / "c", "fedavg", 2, 0.01),
        run_config(tmp_path / "d", "fedavg", 3, 0.02, **{"train.rounds": 1}),
    ]
    plan = pack_runs(configs)
    assert plan.packs == ((2, 3),) and sorted(plan.alone) == [0, 1]
    assert "engine.vectorize='off'" in plan.alone[0] and "model" in plan.alone[1]
    with caplog.at_level(logging.INFO, logger="rayfed.packs.run_many"):
        rayfed.run_many(configs[:2])
    lines = [r.getMessage() for r in caplog.records if " alone (" in r.getMessage()]
    assert len(lines) == 1 and "run 0 alone (" in lines[0] and "run 1 alone (" in lines[0], lines
    assert all((tmp_path / name / "summary.json").exists() for name in "ab")


class _Fails(Callback):
    """Fails its run after round 0 (a tracker or pruner that raises)."""

    def after_round(self, run: Any, record: Any, clients: Any) -> bool:
        raise RuntimeError("this run's callback failed")


@pytest.mark.slow
def test_a_run_that_fails_leaves_the_others_to_finish_with_their_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, merged: list[int]
) -> None:
    proximal = FedProxClient.proximal

    def raising(self: FedProxClient, *args: Any) -> Any:  # a plugin's loss that raises for one run's clients
        if self.params.mu == 0.5:
            raise ValueError("a bad plugin's loss")
        return proximal(self, *args)

    monkeypatch.setattr(FedProxClient, "proximal", raising)
    configs = [
        *pack_configs(tmp_path, "fedprox", **{"train.rounds": 3}),
        run_config(tmp_path / "cb", "fedprox", 3, 0.02, 0.2),
    ]
    with pytest.raises(ValueError, match="a bad plugin's loss"):
        rayfed.run_many(configs, callbacks=[[], [], [], [_Fails()]])
    monkeypatch.setattr(FedProxClient, "proximal", proximal)
    assert merged  # the runs that did not fail kept sharing their stacks
    for config in configs[:2]:
        rayfed.run(alone_config(config))
        assert_same_numbers(config.run_dir, alone_config(config).run_dir)
    assert not (Path(configs[2].run_dir) / "summary.json").exists()
    assert len(rounds_of(configs[3].run_dir)) <= 2  # its initial evaluation and round 0, then its callback failed


@pytest.mark.slow
def test_a_killed_pack_resumes_to_the_numbers_of_its_runs_uninterrupted(tmp_path: Path) -> None:
    overrides = pack_overrides(tmp_path, "cwfedavg", **{"train.rounds": 3, "engine.checkpoint_every": 1})
    configs = [RunConfig().override(o) for o in overrides]
    driver = driver_past_round_0(overrides)
    driver.kill()  # SIGKILL: nothing is tidied
    driver.wait()
    assert not all((Path(c.run_dir) / "summary.json").exists() for c in configs)
    rayfed.run_many(configs, resume=True)
    for config in configs:
        rayfed.run(alone_config(config))
        assert_same_numbers(config.run_dir, alone_config(config).run_dir)
