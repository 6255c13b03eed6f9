"""``rayfed reproduce`` on a damaged run directory and on bad options: one line naming what is wrong and the
fix, nothing a user made deleted, and the rest of the table still planned, reported or run."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rayfed
from rayfed.cli import main
from rayfed.engine.interrupts import RunInterrupted
from rayfed.reproduce import Table
from rayfed.reproduce.runner import plan
from tests.reproduce.test_reproduce import TINY, _StopAfterFirstRound, tiny_table  # noqa: F401  (the fixture)


def _reproduce(out: Path, *extra: str) -> int:
    return main(["reproduce", TINY.name, "--rounds", "2", "--seeds", "1", "--out", str(out), "--no-figures", *extra])


def _run_dir(out: Path, row: str) -> Path:
    (cell,) = [c for c in plan(TINY, out, rounds=2, seeds=[0]) if c.row.key == row]
    assert cell.run_dir is not None
    return cell.run_dir


def _tear_footer(path: Path) -> None:
    """Overwrite the start of a Parquet file's footer: pyarrow then fails with "Couldn't deserialize thrift"."""
    data = bytearray(path.read_bytes())
    footer = len(data) - 8 - struct.unpack("<i", data[-8:-4])[0]
    data[footer : footer + 40] = b"\xff" * 40
    path.write_bytes(bytes(data))


@pytest.fixture
def damaged(tiny_table: Table, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:  # noqa: F811
    """A finished FedAvg run whose rounds.parquet was torn, holding a file of the user's."""
    out = tmp_path / "out"
    assert _reproduce(out, "--methods", "fedavg") == 0
    run_dir = _run_dir(out, "fedavg")
    _tear_footer(run_dir / "rounds.parquet")
    with pytest.raises(OSError, match="Couldn't deserialize thrift"):
        pq.read_table(run_dir / "rounds.parquet")
    (run_dir / "notes.txt").write_text("mine")
    capsys.readouterr()
    return run_dir


@pytest.mark.parametrize("mode", ["--plan", "--report-only"])
def test_a_damaged_run_is_named_and_the_rest_of_the_table_planned_or_reported(
    mode: str, damaged: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = damaged.parents[1]

    code = _reproduce(out, mode)

    printed = capsys.readouterr()
    assert code == 1 and "Traceback" not in printed.err
    if mode == "--plan":  # the damaged run is costed as the plain command makes it: run again from round 0
        assert "fedavg             path              0       0/2" in printed.out
        assert "cwfedavg           path              0       0/2" in printed.out and "plan: cells=2" in printed.out
    else:
        assert "| FedAvg (global) | not run |" in (out / "tiny-test.md").read_text()
    (line,) = [line for line in printed.err.splitlines() if line.startswith("rayfed: error:")]
    assert f"run directory {str(damaged)!r} is damaged: its rounds.parquet cannot be read: it is not a " in line
    assert "Couldn't deserialize thrift" in line and "without --plan and --report-only, which moves it aside" in line
    assert damaged.is_dir() and (damaged / "notes.txt").read_text() == "mine"  # neither moves anything


def test_plan_says_what_it_times_and_how_far_it_is(damaged: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _reproduce(damaged.parents[1], "--plan")

    err = capsys.readouterr().err  # not a terminal: one line per calibration, no bar's redraws
    assert "--plan: timing 2 row x column shapes that no run under --out has timed, by 2 rounds of each here" in err
    assert "--plan: timing fedavg x path: 1/2 shape (cost=" in err
    assert "--plan: timing cwfedavg x path: 2/2 shape (cost=" in err and "\r" not in err


def test_reproduce_moves_a_damaged_run_aside_says_where_and_runs_it_again(
    damaged: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = damaged.parents[1]

    code = _reproduce(out, "--methods", "fedavg")

    printed = capsys.readouterr().out
    (aside,) = damaged.parent.glob(f"{damaged.name}.damaged-*")
    assert code == 0 and "fedavg path seed 0: ran" in printed
    assert f"moved the damaged run aside to {aside} (its rounds.parquet cannot be read: it is not a readable" in printed
    assert "(Couldn't deserialize thrift" in printed
    assert "and ran the cell again from round 0; 2 rounds, best" in printed
    assert (aside / "notes.txt").read_text() == "mine" and (aside / "rounds.parquet").is_file()  # nothing lost
    assert len(pq.read_table(damaged / "rounds.parquet").to_pylist()) == 3  # the initial model and 2 rounds


def test_a_damaged_summary_is_moved_aside_too(
    tiny_table: Table,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    assert _reproduce(out, "--methods", "fedavg") == 0
    run_dir = _run_dir(out, "fedavg")
    (run_dir / "summary.json").write_text("{not json")
    capsys.readouterr()

    assert _reproduce(out, "--methods", "fedavg", "--plan") == 1
    assert "is damaged: its summary.json cannot be read (JSONDecodeError" in capsys.readouterr().err
    assert _reproduce(out, "--methods", "fedavg") == 0
    assert "summary.json cannot be read" in capsys.readouterr().out
    assert len(list(run_dir.parent.glob(f"{run_dir.name}.damaged-*"))) == 1 and (run_dir / "summary.json").is_file()


def test_a_torn_checkpoint_of_a_stopped_run_is_moved_aside_not_deleted(
    tiny_table: Table,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    (cell,) = [c for c in plan(TINY, out, rounds=2, seeds=[0]) if c.row.key == "fedavg"]
    assert cell.config is not None and cell.run_dir is not None
    with pytest.raises(RunInterrupted):
        rayfed.run(cell.config, callbacks=[_StopAfterFirstRound()])
    (checkpoint,) = (cell.run_dir / "checkpoints").glob("*.npz")
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])

    assert _reproduce(out, "--methods", "fedavg") == 0

    (aside,) = cell.run_dir.parent.glob(f"{cell.run_dir.name}.damaged-*")
    assert (aside / "checkpoints" / checkpoint.name).stat().st_size == 100
    assert f"moved the damaged run aside to {aside} (checkpoint" in capsys.readouterr().out


@pytest.mark.parametrize("option", ["--data-root", "RAYFED_DATA"])
def test_a_data_root_that_does_not_exist_is_refused_naming_the_option(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no-such-folder"
    args = ["reproduce", "cwfedavg-mnist", "--plan", "--out", str(tmp_path / "out")]
    if option == "RAYFED_DATA":
        monkeypatch.setenv("RAYFED_DATA", str(missing))
    else:
        args += ["--data-root", str(missing)]

    code = main(args)

    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"rayfed: error: {option}={str(missing)!r} does not exist; give the folder")
    assert "--set data.download=true" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("share", ["-1", "nan", "half"])
def test_a_bad_gpu_share_names_the_option_typed(share: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["reproduce", "cwfedavg-mnist", "--plan", "--gpus-per-run", share])

    err = capsys.readouterr().err
    assert raised.value.code == 2 and "argument --gpus-per-run: expected a GPU share >= 0" in err
    assert "engine.num_gpus_per_worker" not in err


def test_plan_over_a_data_root_without_the_data_names_it_once_with_the_fetch_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "data"
    empty.mkdir()
    args = ["--plan", "--data-root", str(empty), "--rounds", "2", "--seeds", "1", "--out", str(tmp_path / "out")]

    code = main(["reproduce", "cwfedavg-mnist", "--methods", "fedavg,cwfedavg", *args])

    out = capsys.readouterr().out
    assert code == 0 and out.count("data missing (below)") == 4 and out.count("fetch: ") == 1
    assert f"* dataset 'mnist': files missing under root {str(empty)!r}: MNIST/raw/train-images-idx3-ubyte.gz" in out
    assert 'load_dataset("mnist"' in out and "to run: 4 of 4 cells, 0 s of runs" in out


def test_a_cells_changed_plugin_named_by_set_is_refused_before_it_is_imported(
    tiny_table: Table,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Prepare: a cell's run sealed with note.py; then note.py edited to write a file when imported.
    from rayfed.provenance.run_identity import RunMarker
    from rayfed.util.plugin_sources import locate

    monkeypatch.chdir(tmp_path)
    note, ran, out = tmp_path / "note.py", tmp_path / "ran", tmp_path / "out"
    note.write_text("# registers nothing\n")
    run_dir = out / "runs" / "fedavg-synthetic-s0-0123456789"
    run_dir.mkdir(parents=True)
    sealed = locate("note.py")
    RunMarker.new("identity", 2).recording({}, [sealed.record()], []).write(run_dir)
    note.write_text(f"import pathlib\npathlib.Path({str(ran)!r}).write_text('ran')\n")
    edited = locate("note.py")
    # Execute: the reproduction again, naming note.py for every cell.
    code = _reproduce(out, "--set", "plugins=note.py", "--no-figures")
    # Check: one line naming the run, the file and both digests; note.py never ran; accepted, it is imported.
    error = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in error and not ran.exists(), error
    assert f"run_dir={str(run_dir)!r} was sealed with plugin 'note.py'" in error
    assert f"sha256 {sealed.short}), which now holds sha256 {edited.short}" in error
    assert f"--accept-plugin {edited.short}" in error
    _reproduce(out, "--set", "plugins=note.py", "--no-figures", "--plan", "--accept-plugin", edited.short)
    assert ran.exists()
