"""Reading a run directory or a study runs none of its code; continuing one refuses what its run did not seal.

A finished run whose ``config.json`` was given a ``plugins`` entry (a ``.py`` file, relative or absolute, or a
module name) that writes a file when imported: ``rayfed plot``, the results API, ``rayfed reproduce
--report-only`` and ``--plan``, and a study's report over such a study write nothing and run nothing, and
``rayfed run --resume`` is refused in one line before anything runs (README.md, "What a run directory may do").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest

import rayfed
from rayfed.cli import main
from rayfed.provenance.run_identity import MARKER_FILE
from rayfed.reproduce import TABLES
from rayfed.reproduce.runner import plan
from rayfed.results.run_data import load_run
from tests.conftest import tiny_overrides
from tests.reproduce.test_reproduce import TINY

WRITES = "import pathlib\npathlib.Path({where!r}).write_text('ran')\n"
ENTRIES = ("relative", "absolute", "module")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    rayfed.run(tiny_overrides(run_dir, **{"train.rounds": 1, "engine.checkpoint_every": 1}))
    return run_dir


def _poisoned(tmp_path: Path, finished: Path, entry: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A copy of ``finished`` whose config.json names code that writes ``ran`` when imported, in the working
    directory the reader uses; returns (the run directory, the file the code would write)."""
    here = tmp_path / "shared"
    run_dir = here / "run"
    shutil.copytree(finished, run_dir)
    ran = tmp_path / "ran"
    (here / "note.py").write_text(WRITES.format(where=str(ran)))
    named = {"relative": "note.py", "absolute": str(here / "note.py"), "module": "note"}[entry]
    saved = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**saved, "plugins": [named]}))
    monkeypatch.chdir(here)
    monkeypatch.syspath_prepend(str(here))  # a module name would be found by any import here
    return run_dir, ran


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(params=ENTRIES)
def poisoned(
    request: pytest.FixtureRequest, tmp_path: Path, finished: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path]:
    """:func:`_poisoned` for each way ``plugins`` names the code (a relative path, an absolute one, a module)."""
    return _poisoned(tmp_path, finished, request.param, monkeypatch)


def test_plot_and_the_results_api_read_a_run_without_running_its_plugins(
    poisoned: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, ran = poisoned
    before = _snapshot(run_dir)
    data = load_run(run_dir)
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "figures")]) == 0
    assert data.algorithm == "fedavg" and data.has_rounds and data.method_held
    assert (tmp_path / "figures" / "accuracy.png").stat().st_size > 1000
    assert not ran.exists() and "note" not in __import__("sys").modules
    assert _snapshot(run_dir) == before
    assert capsys.readouterr().err == ""


def test_a_resume_over_a_run_whose_config_names_new_code_is_refused_before_anything_runs(
    poisoned: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, ran = poisoned
    before = _snapshot(run_dir)
    assert main(["run", "--resume", str(run_dir), "train.rounds=2"]) == 2
    error = capsys.readouterr().err.strip()
    assert "config.json was edited after its run sealed it: plugins is" in error and "\n" not in error
    assert not ran.exists() and _snapshot(run_dir) == before


def test_a_forged_unsealed_marker_does_not_let_a_resume_import_code(
    tmp_path: Path, finished: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A marker as rayfed wrote them before they were sealed (format 1), written by someone without the key."""
    run_dir, ran = _poisoned(tmp_path, finished, "relative", monkeypatch)
    sealed = json.loads((run_dir / MARKER_FILE).read_text())
    old = {"format": 1, **{k: sealed[k] for k in ("identity", "created", "train_rounds")}}
    (run_dir / MARKER_FILE).write_text(json.dumps(old))
    before = _snapshot(run_dir)
    assert main(["run", "--resume", str(run_dir), "train.rounds=2"]) == 2
    error = capsys.readouterr().err.strip()
    digest = __import__("hashlib").sha256((run_dir.parent / "note.py").read_bytes()).hexdigest()[:16]
    assert f"plugin 'note.py' ({run_dir.parent / 'note.py'}, sha256 {digest}) is not code it was sealed" in error
    assert f"--accept-plugin {digest}" in error and "predates sealed markers" in error and "\n" not in error
    assert not ran.exists() and _snapshot(run_dir) == before


def test_reproduce_report_only_and_plan_read_cells_without_running_their_plugins(
    tmp_path: Path, finished: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(TABLES, TINY.name, TINY)
    out = tmp_path / "out"
    cell = next(c for c in plan(TINY, out, rounds=1, seeds=[0]) if c.config is not None)
    assert cell.run_dir is not None
    poisoned, ran = _poisoned(tmp_path, finished, "absolute", monkeypatch)
    shutil.copytree(poisoned, cell.run_dir)
    before = _snapshot(cell.run_dir)
    for option in ("--report-only", "--plan"):
        main(["reproduce", TINY.name, "--rounds", "1", "--seeds", "1", "--out", str(out), option, "--no-figures"])
    assert (out / "tiny-test.md").is_file() and not ran.exists()
    assert _snapshot(cell.run_dir) == before


def test_a_studys_report_reads_its_base_config_without_running_its_plugins(
    tmp_path: Path, finished: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: a finished study whose stored base config names code that writes when imported.
    _, ran = _poisoned(tmp_path, finished, "relative", monkeypatch)
    from rayfed.config.args import config_from_args
    from rayfed.tuning import attrs
    from rayfed.tuning.space import load_space

    space = tmp_path / "space.yaml"
    space.write_text("train.lr: {type: float, low: 0.001, high: 0.1, log: true}\n")
    args = [f"{key}={json.dumps(value)}" for key, value in tiny_overrides(tmp_path / "x").items() if key != "run_dir"]
    base = config_from_args(args).override({"engine.progress": False})
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    study = optuna.create_study(study_name="space", storage=f"sqlite:///{study_dir / 'study.db'}", direction="maximize")
    study.set_user_attr(attrs.BASE_CONFIG, {**base.to_dict(), "plugins": ["note.py"]})
    study.set_user_attr(attrs.SPACE, load_space(space).to_dict())
    distribution = optuna.distributions.FloatDistribution(0.001, 0.1, log=True)
    study.add_trial(
        optuna.trial.create_trial(params={"train.lr": 0.01}, distributions={"train.lr": distribution}, value=0.5)
    )
    # Execute: the same command again (the study holds its one trial): the report.
    code = main(["tune", str(space), *args, "--trials", "1", "--study-dir", str(study_dir), "--no-plots"])
    # Check
    assert code == 0 and "study 'space': 1 complete" in capsys.readouterr().out
    assert not ran.exists()


def test_a_resume_of_a_run_whose_config_json_was_edited_names_the_field(
    tmp_path: Path, finished: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    saved = json.loads((run_dir / "config.json").read_text())
    saved["train"]["lr"] = 0.1
    (run_dir / "config.json").write_text(json.dumps(saved))
    before = _snapshot(run_dir)
    assert main(["run", "--resume", str(run_dir), "train.rounds=2"]) == 2
    error = capsys.readouterr().err.strip()
    assert (
        "its config.json was edited after its run sealed it: train.lr is 0.1 in the file, 0.005 in the sealed" in error
    )
    assert "\n" not in error and _snapshot(run_dir) == before


def test_a_run_whose_method_is_not_importable_here_still_draws_its_accuracy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: a run of a method in a file that writes when imported; then a process that does not hold it.
    import sys

    from rayfed.algorithms import ALGORITHMS
    from tests.util.test_plugins import USER_METHOD, _user_file

    ran = tmp_path / "ran"
    method = _user_file(tmp_path / "code", "unheld_method", WRITES.format(where=str(ran)) + USER_METHOD)
    run_dir = tmp_path / "run"
    overrides = {"plugins": [str(method)], "algorithm.name": "unheld_method", "engine.checkpoint_every": 1}
    rayfed.run(tiny_overrides(run_dir, **overrides))
    ALGORITHMS._items.pop("unheld_method")
    for name in [name for name, module in sys.modules.items() if getattr(module, "__file__", None) == str(method)]:
        monkeypatch.delitem(sys.modules, name)
    ran.unlink()
    # Execute
    code = main(["plot", str(run_dir), "--out", str(tmp_path / "figures")])
    # Check: the accuracy curve, the method's own figures named as skipped, nothing run.
    out = capsys.readouterr().out
    assert code == 0 and (tmp_path / "figures" / "accuracy.png").stat().st_size > 1000
    assert "unheld_method is not registered in this process" in out and "its own figures are skipped" in out
    assert not ran.exists() and load_run(run_dir).method_held is False
