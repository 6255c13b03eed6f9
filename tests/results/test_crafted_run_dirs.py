"""A run directory from someone else is read without writing anywhere but ``--out``: one whose ``config.json``
names a dataset root holding a crafted archive (beside the run or inside it, with a relative root), and whose
``label_counts.parquet`` was removed, so that its figures would need the dataset. ``rayfed plot``, the results
API and ``rayfed reproduce --report-only`` never extract, download or decompress what it points to: the figures
that need the dataset are named as skipped, the accuracy curve is drawn, and every folder outside ``--out`` is as
it was (README.md, "What a run directory may do")."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import rayfed
from rayfed.cli import main
from rayfed.data import LABEL_COUNTS_FILE
from rayfed.reproduce import TABLES
from rayfed.reproduce.runner import plan
from rayfed.results.run_data import finished_run, load_run
from rayfed.util.errors import CheckpointError
from tests.conftest import tiny_overrides
from tests.data.crafted_archive import crafted_archive, tree_state
from tests.reproduce.test_reproduce import TINY

pytest.importorskip("matplotlib")

WHERE = ("beside the run", "inside the run, relative root")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    rayfed.run(tiny_overrides(run_dir, **{"train.rounds": 1, "engine.checkpoint_every": 1}))
    return run_dir


def _crafted(tmp_path: Path, finished: Path, where: str, monkeypatch: pytest.MonkeyPatch, run_dir: Path) -> None:
    """Copy ``finished`` to ``run_dir``, pointing its config at a CIFAR-10 root that holds a crafted archive, its
    class counts removed; the reader works in ``tmp_path/shared``, the run's parent."""
    shutil.copytree(finished, run_dir)
    reader = tmp_path / "shared"
    archive_root = tmp_path / "data" if where == "beside the run" else run_dir / "data"
    root = str(archive_root) if where == "beside the run" else os.path.relpath(archive_root, reader)
    crafted_archive(archive_root / "cifar-10-python.tar.gz", tmp_path / "escape", inside="cifar-10-batches-py/")
    saved = json.loads((run_dir / "config.json").read_text())
    saved["data"].update({"dataset": "cifar10", "root": str(root), "options": {}})
    (run_dir / "config.json").write_text(json.dumps(saved))
    (run_dir / LABEL_COUNTS_FILE).unlink()
    reader.mkdir(exist_ok=True)
    monkeypatch.chdir(reader)


@pytest.mark.parametrize("where", WHERE)
def test_plot_and_the_results_api_extract_nothing_a_crafted_run_points_to(
    tmp_path: Path, finished: Path, where: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare
    run_dir = tmp_path / "shared" / "run"
    _crafted(tmp_path, finished, where, monkeypatch, run_dir)
    out = tmp_path / "figures"
    before = tree_state(tmp_path, leave_out=out)
    # Execute
    code = main(["plot", "run", "--out", str(out)])
    data = load_run(run_dir)
    with pytest.raises(CheckpointError) as raised:
        finished_run(data)
    # Check: the curve drawn, the figures that need the dataset named as skipped, nothing written outside --out
    printed = capsys.readouterr()
    assert code == 0 and sorted(p.name for p in out.iterdir()) == ["accuracy.png"]
    assert f"no {LABEL_COUNTS_FILE}" in printed.out and "drawing never loads the dataset" in printed.out
    assert "\n" not in str(raised.value) and "never loads the dataset its config names" in str(raised.value)
    assert tree_state(tmp_path, leave_out=out) == before
    assert not (tmp_path / "escape").exists() or not any((tmp_path / "escape").iterdir())


@pytest.mark.parametrize("where", WHERE)
def test_reproduce_report_only_extracts_nothing_a_crafted_cell_points_to(
    tmp_path: Path, finished: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(TABLES, TINY.name, TINY)
    out = tmp_path / "shared" / "out"
    cell = next(c for c in plan(TINY, out, rounds=1, seeds=[0]) if c.config is not None)
    assert cell.run_dir is not None
    _crafted(tmp_path, finished, where, monkeypatch, cell.run_dir)
    runs = out / "runs"  # what reproduce writes beside them (its report, its figures) is what the user asked for
    before = (tree_state(tmp_path, leave_out=out), tree_state(runs))
    code = main(["reproduce", TINY.name, "--rounds", "1", "--seeds", "1", "--out", str(out), "--report-only"])
    assert code == 0 and (out / "tiny-test.md").is_file()
    assert (tree_state(tmp_path, leave_out=out), tree_state(runs)) == before
