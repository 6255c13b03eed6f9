"""``rayfed.run_many`` on Ray: a pack of ``engine.backend="ray"`` runs is one Ray task, its host, and each run gives
the rounds it gives alone on Ray, records its own config (backend ray) and continues alone or packed.

The runs of each pack differ in their seeds, learning rates and WDR's lambda (tests/packs/pack_configs.py). The
driver's log says where each pack trained and how many of its stacks trained with another run's: that the runs
really shared stacks, on a Ray node rather than in the driver.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

import rayfed
from rayfed.config import RunConfig
from rayfed.engine.callbacks import Callback
from rayfed.provenance.run_lock import LOCK_FILE, LockOwner
from rayfed.util.plugin_sources import import_plugins
from rayfed.util.processes import is_running
from tests.packs.pack_configs import (
    alone_config,
    assert_same_numbers,
    driver_past_round_0,
    pack_configs,
    pack_overrides,
    run_config,
)
from tests.util.test_plugins import USER_METHOD, _user_file
from tests.waiting import wait_until

ON_RAY = {"engine.backend": "ray", "engine.num_workers": 1}
"""Each run alone on one worker of the session's Ray (two CPUs: a pack's host, or a run's worker, takes one)."""
MERGED = re.compile(r"runs ([\d, ]+) shared one stack in host .* \(Ray node \w+\), pid \d+: (\d+) of their stacks")


def _merged(caplog: Any) -> dict[str, int]:
    """The packs the driver's log says trained on a Ray node -> how many of their stacks trained with another's."""
    found = (MERGED.search(record.getMessage()) for record in caplog.records)
    return {match.group(1): int(match.group(2)) for match in found if match}


@pytest.mark.slow
def test_a_pack_on_ray_gives_each_run_the_rounds_it_gives_alone_on_ray(
    tmp_path: Path, ray_cluster: Any, caplog: Any
) -> None:
    configs = pack_configs(tmp_path, "cwfedavg", **ON_RAY)
    with caplog.at_level(logging.INFO, logger="rayfed.packs.run_many"):
        results = rayfed.run_many(configs)
    merged = _merged(caplog)
    assert list(merged) == ["0, 1, 2"] and merged["0, 1, 2"] >= 3, merged  # the three runs' stacks trained as one
    for config, result in zip(configs, results):
        assert Path(result.run_dir) == Path(config.run_dir)
        recorded = json.loads((Path(config.run_dir) / "config.json").read_text())
        assert recorded["engine"]["backend"] == "ray"  # the user's config, as given
        rayfed.run(alone_config(config))
        assert_same_numbers(config.run_dir, alone_config(config).run_dir)


RAISING_METHOD = USER_METHOD.replace(
    "    def term(self, out, batch, params, constants):\n",
    "    def term(self, out, batch, params, constants):\n"
    "        if self.params.mu == 0.5:\n"
    '            raise ValueError("a bad plugin\'s loss")\n',
)
"""A user's method, in a user's module that no Ray worker has on its path, whose loss raises for one run."""


@pytest.mark.slow
def test_a_run_that_fails_in_a_pack_on_ray_leaves_the_others_their_numbers(
    tmp_path: Path, ray_cluster: Any, caplog: Any
) -> None:
    import_plugins([str(_user_file(tmp_path / "code", "raising_prox", RAISING_METHOD))])
    assert "raise ValueError" in RAISING_METHOD
    configs = [
        run_config(tmp_path / f"run-{i}", "raising_prox", seed, 0.01, **{**ON_RAY, "algorithm.params.mu": mu})
        for i, (seed, mu) in enumerate([(0, 0.01), (1, 0.5), (2, 0.1)])
    ]
    with caplog.at_level(logging.INFO, logger="rayfed.packs.run_many"):
        with pytest.raises(ValueError, match="a bad plugin's loss"):
            rayfed.run_many(configs)
    assert _merged(caplog)["0, 1, 2"] >= 2  # the runs that did not fail kept sharing their stacks
    assert not (Path(configs[1].run_dir) / "summary.json").exists()
    for config in (configs[0], configs[2]):
        rayfed.run(alone_config(config))
        assert_same_numbers(config.run_dir, alone_config(config).run_dir)


class _Holds(Callback):
    """A callback holding a lock, which no pickle can send to a pack's host."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


@pytest.mark.slow
def test_a_packed_ray_run_continues_alone_and_one_whose_callbacks_cannot_be_sent_runs_alone(
    tmp_path: Path, ray_cluster: Any, caplog: Any
) -> None:
    configs = pack_configs(tmp_path, "cwfedavg", **{**ON_RAY, "train.rounds": 1})
    with caplog.at_level(logging.INFO, logger="rayfed.packs"):
        rayfed.run_many(configs, callbacks=[[], [], [_Holds()]])
    assert list(_merged(caplog)) == ["0, 1"]
    assert any("run 2 trains alone: its callbacks cannot be sent" in r.getMessage() for r in caplog.records)
    assert (Path(configs[2].run_dir) / "summary.json").exists()  # alone, on Ray's workers
    longer = configs[1].override({"train.rounds": 2})
    rayfed.run(longer, resume=True)  # alone, on Ray's workers, from the pack's checkpoint
    rayfed.run(alone_config(longer))
    assert_same_numbers(longer.run_dir, alone_config(longer).run_dir)


def _host_gone(run_dir: Path) -> bool:
    """Whether the process that held ``run_dir``'s lock (the pack's host) has ended."""
    owner = LockOwner.read(run_dir / LOCK_FILE)
    return owner is None or is_running(owner.process) is False


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT], ids=["Ctrl-C"])
def test_a_pack_on_ray_whose_driver_is_stopped_resumes_to_the_numbers_uninterrupted(
    tmp_path: Path, ray_cluster: Any, stop: signal.Signals
) -> None:
    overrides = pack_overrides(tmp_path, "cwfedavg", **{**ON_RAY, "train.rounds": 3, "engine.checkpoint_every": 1})
    configs = [RunConfig().override(o) for o in overrides]
    driver = driver_past_round_0(overrides)
    driver.send_signal(stop)  # Ctrl-C: the hosts are cancelled as a kill would (SIGKILL: tests/packs/test_run_many.py)
    driver.wait()
    for config in configs:
        wait_until(lambda run_dir=Path(config.run_dir): _host_gone(run_dir), "the pack's host to end")
    assert not all((Path(c.run_dir) / "summary.json").exists() for c in configs)
    rayfed.run_many(configs, resume=True)
    for config in configs:
        rayfed.run(alone_config(config))
        assert_same_numbers(config.run_dir, alone_config(config).run_dir)
