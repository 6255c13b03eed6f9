"""``rayfed.run_many``: runs that share a model share one stack, and each gives the rounds it gives alone.

Each pack's runs differ in their seeds (their partitions, samples and initial models), learning rates and the
hyper-parameters their losses read; the merger's count of stacks trained with another run's says that they really
shared stacks. A run that fails, in the merged stack or in its own driver, leaves the others to finish with their
numbers; a pack whose driver is SIGKILLed resumes to the numbers of its runs uninterrupted.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import rayfed
from rayfed.algorithms.fedprox import FedProxClient
from rayfed.config import RunConfig
from rayfed.engine.callbacks import Callback
from rayfed.execution import stack_merger
from rayfed.execution.run_packs import pack_runs
from tests.conftest import tiny_overrides
from tests.waiting import wait_for_file

REPO = Path(__file__).resolve().parents[2]
LOSS_RTOL, ACCURACY_ATOL = 1e-3, 0.02
"""The stacked path's run-level agreement (tests/train/test_stacked.py): a stack that holds other runs' clients is a
stack of another width, which sums its grouped products in another order, and training carries the last bits'
difference on from round to round (benchmarks/packed_runs.py, RUNS_TOLERANCE)."""
HYPER = {"fedprox": "algorithm.params.mu", "cwfedavg": "algorithm.params.wdr_lambda", "ditto": "algorithm.params.lam"}
"""What each method's loss reads that the runs of a pack differ in."""


def _overrides(run_dir: Path, method: str, seed: int, lr: float, value: float | None, **extra: Any) -> dict[str, Any]:
    overrides = tiny_overrides(
        run_dir,
        seed=seed,
        **{
            "algorithm.name": method,
            "train.lr": lr,
            "engine.vectorize": "on",
            "data.num_clients": 8,
            "data.partition": "dirichlet",
            "data.alpha": 0.3,
            "engine.clients_per_call": 4,
        },
    )
    if value is not None:
        overrides[HYPER[method]] = value
    overrides.update(extra)
    return overrides


def _config(run_dir: Path, method: str, seed: int, lr: float, value: float | None = None, **extra: Any) -> RunConfig:
    return RunConfig().override(_overrides(run_dir, method, seed, lr, value, **extra))


def _pack_overrides(tmp_path: Path, method: str, **extra: Any) -> list[dict[str, Any]]:
    values = (0.01, 0.1, 0.5) if method in HYPER else (None, None, None)
    return [
        _overrides(tmp_path / f"{method}-{i}", method, seed, lr, value, **extra)
        for i, (seed, lr, value) in enumerate(zip((0, 1, 2), (0.01, 0.03, 0.01), values))
    ]


def _pack(tmp_path: Path, method: str, **extra: Any) -> list[RunConfig]:
    return [RunConfig().override(o) for o in _pack_overrides(tmp_path, method, **extra)]


def _alone(config: RunConfig) -> RunConfig:
    return config.override({"run_dir": f"{config.run_dir}-alone"})


def _rounds(run_dir: Path) -> list[dict[str, Any]]:
    return pq.read_table(Path(run_dir) / "rounds.parquet").to_pylist()


def _assert_same_numbers(packed: Path, alone: Path) -> None:
    one, other = _rounds(packed), _rounds(alone)
    assert len(one) == len(other)
    keys = [k for k in one[0] if ("loss" in k or "acc" in k) and isinstance(one[0][k], float)]
    assert "train_loss" in keys and "accuracy" in keys
    for a, b in zip(one, other):
        for key in keys:
            both_nan = math.isnan(a[key]) and math.isnan(b[key])
            tolerance = {"abs_tol": ACCURACY_ATOL} if "acc" in key else {"rel_tol": LOSS_RTOL}
            assert both_nan or math.isclose(a[key], b[key], **tolerance), (a["round"], key, a[key], b[key])


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
@pytest.mark.parametrize("method", ["fedavg", "fedprox", "cwfedavg", "ditto", "fedper", "fedrep"])
def test_a_packed_run_gives_the_rounds_it_gives_alone(tmp_path: Path, method: str, merged: list[int]) -> None:
    configs = _pack(tmp_path, method)
    results = rayfed.run_many(configs)
    assert merged and max(merged) == 3  # the three runs trained their stacks as one
    for config, result in zip(configs, results):
        assert Path(result.run_dir) == Path(config.run_dir)
        rayfed.run(_alone(config))
        _assert_same_numbers(config.run_dir, _alone(config).run_dir)


def test_runs_that_cannot_pack_run_alone_and_the_log_says_why_in_one_line(tmp_path: Path, caplog: Any) -> None:
    configs = [
        _config(tmp_path / "a", "fedavg", 0, 0.01, **{"engine.vectorize": "off"}),
        _config(tmp_path / "b", "fedavg", 1, 0.01, **{"model.name": "cnn5"}),
        _config(tmp_path / "c", "fedavg", 2, 0.01),
        _config(tmp_path / "d", "fedavg", 3, 0.02, **{"train.rounds": 1}),
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
    configs = [*_pack(tmp_path, "fedprox", **{"train.rounds": 3}), _config(tmp_path / "cb", "fedprox", 3, 0.02, 0.2)]
    with pytest.raises(ValueError, match="a bad plugin's loss"):
        rayfed.run_many(configs, callbacks=[[], [], [], [_Fails()]])
    monkeypatch.setattr(FedProxClient, "proximal", proximal)
    assert merged  # the runs that did not fail kept sharing their stacks
    for config in configs[:2]:
        rayfed.run(_alone(config))
        _assert_same_numbers(config.run_dir, _alone(config).run_dir)
    assert not (Path(configs[2].run_dir) / "summary.json").exists()
    assert len(_rounds(configs[3].run_dir)) <= 2  # its initial evaluation and round 0, then its callback failed


_DRIVER = """
import json, sys
import rayfed
configs = [rayfed.RunConfig().override(c) for c in json.loads(sys.argv[1])]
rayfed.run_many(configs)
"""


@pytest.mark.slow
def test_a_killed_pack_resumes_to_the_numbers_of_its_runs_uninterrupted(tmp_path: Path) -> None:
    overrides = _pack_overrides(tmp_path, "cwfedavg", **{"train.rounds": 3, "engine.checkpoint_every": 1})
    configs = [RunConfig().override(o) for o in overrides]
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, json.dumps(overrides, default=str)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_for_file(
        Path(configs[0].run_dir) / "checkpoints" / "round_000000.npz", driver, "the pack's checkpoint of round 0"
    )
    driver.kill()  # SIGKILL: nothing is tidied
    driver.wait()
    assert not all((Path(c.run_dir) / "summary.json").exists() for c in configs)
    rayfed.run_many(configs, resume=True)
    for config in configs:
        rayfed.run(_alone(config))
        _assert_same_numbers(config.run_dir, _alone(config).run_dir)
