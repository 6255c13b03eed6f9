"""Start-up of a run on a private local Ray (``rayfed.actors.cluster.ray_session``).

A cluster that rayfed starts for one run is private and loopback-only, so it runs without
token authentication and Ray's token-authentication warning is not printed; a user's own
``RAY_AUTH_MODE`` (and any cluster rayfed joins) is left as it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayfed.actors.cluster import UNWATCHED_CLUSTER_ENV, ray_session
from rayfed.config import EngineConfig
from rayfed.util.errors import ResourceError

AUTH_WARNING = "Token authentication is enabled"


@pytest.mark.slow
def test_private_cluster_prints_no_auth_warning(tmp_path: Path) -> None:
    """A whole `rayfed run` on a Ray it starts, with no RAY_AUTH_MODE in the environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    command = [
        sys.executable,
        "-m",
        "rayfed",
        "run",
        "data.num_clients=4",
        "train.rounds=1",
        "data.options.num_samples=400",
        "engine.num_workers=1",
        "engine.progress=false",
        f"run_dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert AUTH_WARNING not in done.stderr + done.stdout
    assert (tmp_path / "run" / "rounds.parquet").is_file()


def test_auth_mode_is_set_only_for_the_private_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """The private cluster gets RAY_AUTH_MODE=disabled while it runs; a user's setting and a joined
    cluster are untouched (ray.init is replaced: this checks the environment it would start with)."""
    seen: list[str | None] = []
    monkeypatch.setattr("ray.is_initialized", lambda: False)
    monkeypatch.setattr("ray.init", lambda **_: seen.append(os.environ.get("RAY_AUTH_MODE")))
    monkeypatch.setattr("ray.shutdown", lambda: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_preload_python_modules", raising=False)
    with ray_session(EngineConfig()):
        assert os.environ["RAY_AUTH_MODE"] == "disabled"
        assert os.environ["RAY_preload_python_modules"] == "rayfed.actors.server_actor"  # no torch (cluster.py)
    assert "RAY_AUTH_MODE" not in os.environ  # restored after the run
    assert "RAY_preload_python_modules" not in os.environ
    monkeypatch.setattr("rayfed.actors.cluster.check_reachable", lambda address, source: None)  # a cluster there
    monkeypatch.setattr("rayfed.actors.cluster._say_joined", lambda setting, target: None)  # it asks the cluster
    with ray_session(EngineConfig(ray_address="127.0.0.1:6379")):
        pass
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with ray_session(EngineConfig()):
        pass
    assert seen == ["disabled", None, "token"]
    assert os.environ["RAY_AUTH_MODE"] == "token"


def test_a_private_ray_without_a_dashboard_records_no_task_events_or_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Task events and metrics, which only a dashboard (or the state API) reads, are off for a private Ray
    without one; on with the dashboard, for a joined cluster, and wherever the user set them."""
    seen: list[tuple[str | None, str | None]] = []
    monkeypatch.setattr("ray.is_initialized", lambda: False)
    monkeypatch.setattr(
        "ray.init",
        lambda **_: seen.append(
            (os.environ.get("RAY_task_events_report_interval_ms"), os.environ.get("RAY_enable_metrics_collection"))
        ),
    )
    monkeypatch.setattr("ray.shutdown", lambda: None)
    monkeypatch.setattr("rayfed.actors.cluster.check_reachable", lambda address, source: None)
    monkeypatch.setattr("rayfed.actors.cluster._say_joined", lambda setting, target: None)  # the stub has no nodes
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for key in UNWATCHED_CLUSTER_ENV:
        monkeypatch.delenv(key, raising=False)
    with ray_session(EngineConfig()):
        pass
    with ray_session(EngineConfig(dashboard=True)):
        pass
    with ray_session(EngineConfig(ray_address="127.0.0.1:6379")):
        pass
    monkeypatch.setenv("RAY_enable_metrics_collection", "1")
    with ray_session(EngineConfig()):
        pass
    assert seen == [("0", "0"), (None, None), (None, None), ("0", "1")]
    assert "RAY_task_events_report_interval_ms" not in os.environ  # restored after the run


def test_reproduce_starts_its_private_ray_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rayfed reproduce --parallel`` starts Ray through the same ``ray_started`` as a run."""
    from rayfed.reproduce import runner

    seen: list[tuple[str | None, dict]] = []
    monkeypatch.setattr("ray.is_initialized", lambda: False)
    monkeypatch.setattr("ray.init", lambda **kwargs: seen.append((os.environ.get("RAY_AUTH_MODE"), kwargs)))
    monkeypatch.setattr("ray.shutdown", lambda: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert runner._execute_on_ray([], 2, lambda cell, outcome: None) == {}
    assert seen == [("disabled", {"address": "local", "logging_level": 30, "num_cpus": 2, "include_dashboard": False})]
    assert "RAY_AUTH_MODE" not in os.environ


def test_a_private_ray_that_times_out_starting_is_one_line_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's own words when its node does not come up in time (an overloaded machine), then what to do; any other
    failure of ray.init is left as Ray raised it (ray.init is replaced: this checks what a run is told)."""
    timed_out = Exception(
        "The current node timed out during startup. This could happen because some of the raylet failed to startup "
        "or the GCS has become overloaded."
    )

    def fail(**_: object) -> None:
        raise timed_out

    monkeypatch.setattr("ray.is_initialized", lambda: False)
    monkeypatch.setattr("ray.init", fail)
    monkeypatch.setattr("ray.shutdown", lambda: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ResourceError) as raised, ray_session(EngineConfig()):
        pass
    message = str(raised.value)
    assert "\n" not in message and "(Ray: The current node timed out during startup." in message
    assert "run the command again when it is less busy, with fewer workers (engine.num_workers=1)" in message
    timed_out = Exception("something else")
    with pytest.raises(Exception, match="something else"), ray_session(EngineConfig()):
        pass
