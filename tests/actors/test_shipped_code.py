"""A cluster that rayfed joins receives the run's own code as runtime_env ``py_modules``, and nothing the nodes have
already: installed packages, a job's working directory, a script that travels by value (rayfed.actors.shipped_code).
"""

from __future__ import annotations

import json
import logging
import sysconfig
from pathlib import Path

import pytest

from rayfed.actors.shipped_code import runtime_env_for
from rayfed.util.plugin_sources import PluginSource, locate


def _package(root: Path) -> PluginSource:
    (root / "lab" / "methods").mkdir(parents=True)
    (root / "lab" / "__init__.py").write_text("")
    (root / "lab" / "methods" / "__init__.py").write_text("")
    (root / "lab" / "methods" / "prox.py").write_text("X = 1\n")
    return PluginSource("lab.methods.prox", "lab.methods.prox", str(root / "lab/methods/prox.py"), "0" * 64, "name")


def test_a_joined_cluster_gets_each_modules_package_and_each_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    package = _package(tmp_path / "code")
    (tmp_path / "single.py").write_text("Y = 2\n")
    single = locate(str(tmp_path / "single.py"))
    script = PluginSource(str(tmp_path / "s.py"), "__main__", str(tmp_path / "s.py"), "1" * 64, "script")
    installed = PluginSource(
        "yaml", "yaml", str(Path(sysconfig.get_paths()["purelib"]) / "yaml/__init__.py"), "2" * 64, "name"
    )
    env = runtime_env_for([package, single, script, installed, package])
    assert env == {"py_modules": [str(tmp_path / "code" / "lab"), str(tmp_path / "single.py")]}


def test_a_submitted_job_keeps_its_working_directory_and_its_own_py_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    package = _package(tmp_path / "job")
    monkeypatch.chdir(tmp_path / "job")  # where `ray job submit --working-dir` unpacks the job
    monkeypatch.setenv(
        "RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_1.zip"}})
    )
    assert runtime_env_for([package]) == {}
    elsewhere = _package(tmp_path / "elsewhere")
    assert runtime_env_for([elsewhere]) == {"py_modules": [str(tmp_path / "elsewhere" / "lab")]}
    monkeypatch.setenv(
        "RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"py_modules": ["gcs://_ray_pkg_2.zip"]}})
    )
    with caplog.at_level(logging.WARNING, logger="rayfed.actors.shipped_code"):
        assert runtime_env_for([elsewhere]) == {}
    assert f"include {tmp_path / 'elsewhere' / 'lab'}" in caplog.text
