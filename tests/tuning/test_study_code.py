"""A resumed study runs the code it was made with, byte for byte, or a change accepted by its digest, which the
study records (rayfed.tuning.study_code)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import optuna
import pytest

from rayfed import RunConfig
from rayfed.algorithms import ALGORITHMS
from rayfed.tuning import attrs, tune
from rayfed.util import plugin_sources
from rayfed.util.errors import PluginError
from rayfed.util.plugin_check import accept_plugins
from tests.conftest import tiny_overrides
from tests.util.test_plugins import _user_file

SPACE = {"train.lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}}


def _finished_study(tmp_path: Path, base: RunConfig) -> str:
    """A study of ``base`` that holds its one trial, made by :func:`tune` (the trial added as finished)."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="code", storage=storage, direction="maximize")
    distribution = optuna.distributions.FloatDistribution(0.001, 0.1, log=True)
    trial = optuna.trial.create_trial(params={"train.lr": 0.01}, distributions={"train.lr": distribution}, value=0.5)
    study.add_trial(trial)
    return storage


def _next_session(tmp_path: Path, method: Path, overrides: dict[str, object]) -> RunConfig:
    """The base config as a new process builds it: the method's file imported afresh (as it is now)."""
    ALGORITHMS._items.pop("studied_method", None)
    for name in [name for name, module in sys.modules.items() if getattr(module, "__file__", None) == str(method)]:
        del sys.modules[name]
    plugin_sources._loaded.pop(str(method), None)
    return RunConfig().override(tiny_overrides(tmp_path / "x", **overrides))


def test_a_resumed_study_whose_method_file_changed_is_refused_and_continues_once_accepted(tmp_path: Path) -> None:
    # Prepare: a study of a method in a file, whose code the study records when tune first opens it.
    method = _user_file(tmp_path / "code", "studied_method")
    overrides = {"plugins": [str(method)], "algorithm.name": "studied_method"}
    try:
        base = RunConfig().override(tiny_overrides(tmp_path / "x", **overrides))
        storage = _finished_study(tmp_path, base)
        tune(base, SPACE, n_trials=1, study_name="code", study_dir=tmp_path / "trials", storage=storage)
        recorded = optuna.load_study(study_name="code", storage=storage).user_attrs[attrs.PLUGINS]
        method.write_text(method.read_text() + "# edited between sessions\n")
        edited = hashlib.sha256(method.read_bytes()).hexdigest()
        base = _next_session(tmp_path, method, overrides)

        # Execute: resume it; then resume it accepting the edited file.
        with pytest.raises(PluginError) as refused:
            tune(base, SPACE, n_trials=1, study_name="code", study_dir=tmp_path / "trials", storage=storage)
        with accept_plugins(edited[:16]):
            tune(base, SPACE, n_trials=1, study_name="code", study_dir=tmp_path / "trials", storage=storage)
    finally:
        ALGORITHMS._items.pop("studied_method", None)

    # Check
    message = str(refused.value)
    assert [(r["file"], r["sha256"][:16]) for r in recorded] == [(str(method), recorded[0]["sha256"][:16])]
    assert (
        f"study 'code' was sealed with plugin {str(method)!r}" in message
        and f"--accept-plugin {edited[:16]}" in message
    )
    assert f"sha256 {recorded[0]['sha256'][:16]}), which now holds sha256 {edited[:16]}" in message
    saved = optuna.load_study(study_name="code", storage=storage).user_attrs
    assert [r["sha256"] for r in saved[attrs.PLUGINS]] == [edited]
    assert [(a["sealed"], a["now"]) for a in saved[attrs.PLUGINS_ACCEPTED]] == [(recorded[0]["sha256"], edited)]


def test_rayfed_tune_refuses_a_changed_plugin_of_a_resumed_study_before_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: a study that recorded note.py; then note.py edited to write a file when imported.
    from rayfed.cli import main
    from rayfed.util.plugin_sources import locate

    monkeypatch.chdir(tmp_path)
    note, ran = tmp_path / "note.py", tmp_path / "ran"
    note.write_text("# registers nothing\n")
    sealed = locate("note.py").record()
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    study = optuna.create_study(study_name="space", storage=f"sqlite:///{study_dir / 'study.db'}")
    study.set_user_attr(attrs.PLUGINS, [sealed])
    note.write_text(f"import pathlib\npathlib.Path({str(ran)!r}).write_text('ran')\n")
    edited = hashlib.sha256(note.read_bytes()).hexdigest()[:16]
    (tmp_path / "space.yaml").write_text("train.lr: {type: float, low: 0.001, high: 0.1, log: true}\n")
    # Execute: the study's command again, naming note.py as the command line writes a list field.
    code = main(["tune", "space.yaml", "plugins=note.py", "--trials", "1", "--study-dir", str(study_dir)])
    # Check: one line naming the file and both digests, and note.py never ran.
    error = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in error and not ran.exists()
    assert f"study 'space' was sealed with plugin 'note.py' ({note}, sha256 {sealed['sha256'][:16]})" in error
    assert f"which now holds sha256 {edited}" in error and f"--accept-plugin {edited}" in error
