"""A continued run runs the code it was sealed with, byte for byte, or a change the user accepted by digest
(rayfed.provenance.plugin_seal, rayfed.util.plugin_check), found from wherever the resume starts.

The command line is run as a user runs it (the ``rayfed`` script, whose path holds neither the working directory
nor the method's folder).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rayfed
from rayfed import RunConfig
from rayfed.algorithms import ALGORITHMS
from rayfed.cli import main
from rayfed.provenance.run_identity import MARKER_FILE
from rayfed.util.errors import PluginError
from rayfed.util.plugin_check import check_sources
from rayfed.util.plugin_sources import locate
from tests.conftest import tiny_overrides
from tests.util.test_plugins import _user_file

REPO = Path(__file__).resolve().parents[2]
RAYFED = Path(sys.executable).parent / "rayfed"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
    return subprocess.run([str(RAYFED), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def _sets(run_dir: Path, **extra: object) -> list[str]:
    overrides = tiny_overrides(run_dir, **{"train.rounds": 1, "engine.checkpoint_every": 1, **extra})
    return [f"{key}={json.dumps(value) if not isinstance(value, str) else value}" for key, value in overrides.items()]


def _short(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _rounds(run_dir: Path) -> list[int]:
    return [row["round"] for row in pq.read_table(run_dir / "rounds.parquet").to_pylist()]


def test_an_edited_plugin_file_is_refused_naming_both_digests_and_accepted_by_its_digest(tmp_path: Path) -> None:
    # Prepare: a run of a method in a file beside the user, named relatively.
    home = tmp_path / "home"
    method = _user_file(home, "sealed_method")
    run_dir = tmp_path / "run"
    first = _cli("run", "plugins=sealed_method.py", *_sets(run_dir, **{"algorithm.name": "sealed_method"}), cwd=home)
    assert first.returncode == 0, first.stderr[-2000:]
    sealed = _short(method)
    method.write_text(method.read_text() + "# edited after the run started\n")
    edited = _short(method)
    before = _snapshot(run_dir)

    # Execute / Check: a resume is refused in one line naming the file, both digests and the flag; nothing changed.
    refused = _cli("run", "--resume", str(run_dir), "train.rounds=2", cwd=home)
    error = refused.stderr.strip()
    assert refused.returncode == 2 and "\n" not in error, refused.stderr[-2000:]
    assert f"plugin 'sealed_method.py' ({method}, sha256 {sealed}), which now holds sha256 {edited}" in error
    assert f"--accept-plugin {edited}" in error and _snapshot(run_dir) == before
    # Execute / Check: accepted by its digest, the run continues and its marker records the change.
    accepted = _cli("run", "--resume", str(run_dir), "train.rounds=2", "--accept-plugin", edited, cwd=home)
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    marker = json.loads((run_dir / MARKER_FILE).read_text())
    assert [(a["file"], a["sealed"][:16], a["now"][:16]) for a in marker["accepted"]] == [(str(method), sealed, edited)]
    assert [p["sha256"][:16] for p in marker["plugins"]] == [edited] and _rounds(run_dir) == [0, 1]


def test_a_resume_from_another_folder_finds_the_sealed_file_and_refuses_another_one_of_that_name(
    tmp_path: Path,
) -> None:
    home, elsewhere, impostor = tmp_path / "home", tmp_path / "elsewhere", tmp_path / "impostor"
    elsewhere.mkdir()
    _user_file(home / "plug", "travelled_method")
    run_dir = tmp_path / "run"
    first = _cli(
        "run", "plugins=[plug/travelled_method.py]", *_sets(run_dir, **{"algorithm.name": "travelled_method"}), cwd=home
    )
    assert first.returncode == 0, first.stderr[-2000:]
    # From a folder where plug/travelled_method.py is not: the sealed (absolute) file.
    moved = _cli("run", "--resume", str(run_dir), "train.rounds=2", cwd=elsewhere)
    assert moved.returncode == 0, moved.stderr[-2000:]
    # From a folder where the relative entry finds other bytes: refused, naming both files.
    other = _user_file(impostor / "plug", "travelled_method", "raise SystemExit('the impostor ran')\n")
    before = _snapshot(run_dir)
    refused = _cli("run", "--resume", str(run_dir), "train.rounds=3", cwd=impostor)
    error = refused.stderr.strip()
    assert refused.returncode == 2 and "\n" not in error and "impostor ran" not in refused.stderr
    assert f"which resolves here to {other}, which holds sha256 {_short(other)}" in error
    assert str(home / "plug" / "travelled_method.py") in error and _snapshot(run_dir) == before


def test_a_method_in_a_module_beside_the_users_script_resumes_from_that_folder_without_pythonpath(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    _user_file(home, "beside_method")
    script = home / "train.py"
    overrides = tiny_overrides(tmp_path / "run", **{"train.rounds": 1, "algorithm.name": "beside_method"})
    script.write_text(f"import beside_method, rayfed\nrayfed.run({overrides!r})\n")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=home, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["plugins"] == ["beside_method"]
    resumed = _cli("run", "--resume", str(tmp_path / "run"), "train.rounds=2", cwd=home)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _rounds(tmp_path / "run") == [0, 1]


def test_a_resume_whose_plugin_file_is_gone_is_refused_naming_it_and_its_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    method = _user_file(tmp_path / "code", "vanished_method")
    run_dir = tmp_path / "run"
    overrides = {"plugins": [str(method)], "algorithm.name": "vanished_method", "train.rounds": 1}
    try:
        rayfed.run(RunConfig().override(tiny_overrides(run_dir, **overrides)))
    finally:
        ALGORITHMS._items.pop("vanished_method", None)
    sealed = _short(method)
    method.unlink()
    before = _snapshot(run_dir)
    assert main(["run", "--resume", str(run_dir), "train.rounds=2"]) == 2
    error = capsys.readouterr().err.strip()
    assert f"was sealed with plugin {str(method)!r} ({method}, sha256 {sealed}), which is missing here" in error
    assert "plugins=[...]" in error and "\n" not in error and _snapshot(run_dir) == before


def test_a_sealed_file_that_is_there_but_not_named_is_refused_saying_what_it_holds(tmp_path: Path) -> None:
    # Prepare: a run sealed with a method file that is still there, unchanged, then edited
    method = _user_file(tmp_path / "code", "unnamed_method")
    sealed = locate(str(method))
    # Execute: a continuation that names no file
    with pytest.raises(PluginError) as unchanged:
        check_sources("run_dir='r'", [sealed], [])
    method.write_text(method.read_text() + "\n# edited\n")
    with pytest.raises(PluginError) as edited:
        check_sources("run_dir='r'", [sealed], [])
    # Assert: not "missing here", but what the file holds and how to name it
    assert "missing here" not in str(unchanged.value) and "holds the bytes sealed" in str(unchanged.value)
    assert f"plugins=[{str(method)!r}]" in str(unchanged.value)
    assert f"holds sha256 {_short(method)}, not the bytes sealed" in str(edited.value)
