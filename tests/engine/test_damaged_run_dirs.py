"""A damaged run directory is one line, never a traceback, in ``rayfed plot``, ``load_run`` and ``rayfed run
--resume``: the outside probe's cases (issue 63), each refused naming the file, what is wrong and the fix, with
every file outside the run directory (and ``--out``) as it was. The files are bounded by :mod:`rayfed.util.bounded`
before anything is built from them; on a resume the checkpoint's keyed seal is checked before any array is
loaded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import rayfed
from rayfed.cli import main
from rayfed.engine import checkpoint as checkpoints
from rayfed.results.run_data import load_run
from rayfed.util.errors import CheckpointError
from tests.conftest import tiny_overrides
from tests.data.crafted_archive import tree_state
from tests.engine.damage import change_array_bytes, claim_values, column_of_strings, nest_json

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    rayfed.run(tiny_overrides(run_dir, **{"train.rounds": 1, "engine.checkpoint_every": 1}))
    return run_dir


@pytest.fixture
def run_dir(tmp_path: Path, finished: Path) -> Path:
    shutil.copytree(finished, tmp_path / "run")
    return tmp_path / "run"


def _one_line(code: int, capsys: pytest.CaptureFixture[str]) -> str:
    error = capsys.readouterr().err.strip()
    assert code == 2 and error.startswith("rayfed: error: ") and "\n" not in error, error
    return error


def _reads(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What ``rayfed plot``, ``load_run`` and ``rayfed run --resume`` say of ``run_dir``: one line each, nothing
    written outside the run directory."""
    before = tree_state(run_dir.parent)
    out = run_dir.parent / "figures"
    lines = [_one_line(main(["plot", str(run_dir), "--out", str(out)]), capsys)]
    with pytest.raises(CheckpointError) as raised:
        load_run(run_dir)
    assert "\n" not in str(raised.value)
    lines.append(str(raised.value))
    lines.append(_one_line(main(["run", "--resume", str(run_dir), "train.rounds=2"]), capsys))
    assert tree_state(run_dir.parent) == before
    return lines


def test_a_config_json_nested_100000_deep_is_one_line(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nest_json(run_dir / "config.json", 100_000)
    for line in _reads(run_dir, capsys):
        assert f"{str(run_dir / 'config.json')!r} is not a readable run config (it nests deeper than" in line
        assert "restore it from a copy" in line


def test_a_rounds_parquet_whose_accuracy_holds_text_is_one_line(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    column_of_strings(run_dir / "rounds.parquet", "accuracy")
    for line in _reads(run_dir, capsys):
        assert f"{str(run_dir / 'rounds.parquet')!r}" in line and "its column 'accuracy' holds string" in line
        assert "restore it from a copy" in line


def test_a_checkpoint_whose_array_claims_10_to_the_11_values_is_one_line(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    newest = checkpoints.newest_checkpoint(run_dir)
    assert newest is not None
    claim_values(newest, "server/global", 10**11)
    for line in _reads(run_dir, capsys):
        assert f"{str(newest)!r} is truncated or corrupted" in line
        assert "its array 'server/global' claims 100,000,000,000 values of float32" in line


def test_a_resume_checks_the_seal_before_it_loads_an_array(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    newest = checkpoints.newest_checkpoint(run_dir)
    assert newest is not None
    change_array_bytes(newest, "server/global")
    loaded: list[object] = []
    load = checkpoints.load_arrays
    monkeypatch.setattr(
        checkpoints, "load_arrays", lambda path, names=None, **kw: loaded.append(names) or load(path, names, **kw)
    )
    line = _one_line(main(["run", "--resume", str(run_dir), "train.rounds=2"]), capsys)
    assert f"checkpoint {str(newest)!r} is damaged or was changed" in line
    assert loaded and all(names == ("meta",) for names in loaded)  # only the metadata, never an array
