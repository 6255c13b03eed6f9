"""``rayfed reproduce``: a table declared as data runs end to end, resumes, and reports what it cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rayfed
from rayfed.cli import main
from rayfed.engine.callbacks import Callback
from rayfed.engine.interrupts import RunInterrupted
from rayfed.reproduce import TABLES, Column, Row, Table
from rayfed.reproduce.report import write_report
from rayfed.reproduce.runner import Cell, plan, run_dir_name
from rayfed.reproduce.spec import cell_overrides

_SYNTHETIC = {
    "data.dataset": "synthetic",
    "data.options": {"num_samples": 1500},
    "data.num_clients": 10,
    "engine.eval_train_loss": False,
}
TINY = Table(
    name="tiny-test",
    title="FedAvg against cwFedAvg on the offline dataset",
    source="a test table",
    columns=(
        Column(
            "path",
            "Path synthetic",
            "cwfedavg-mnist",
            {**_SYNTHETIC, "data.partition": "pathological", "data.classes_per_client": 2},
        ),
    ),
    rows=(
        Row("fedavg", "FedAvg", "fedavg", paper={"path": "98.08"}),
        Row("cwfedavg", "cwFedAvg (Output)", "cwfedavg", {"variant": "wdr", "classwise_blocks": 1}),
        Row("missing", "Not yet written", "no_such_algorithm", paper={"path": "12.34"}),
    ),
)


@pytest.fixture()
def tiny_table(monkeypatch: pytest.MonkeyPatch) -> Table:
    monkeypatch.setitem(TABLES, TINY.name, TINY)
    return TINY


def _reproduce(out: Path, *extra: str) -> int:
    return main(["reproduce", TINY.name, "--rounds", "2", "--seeds", "2", "--out", str(out), *extra])


def test_cell_config_takes_the_preset_then_column_then_row() -> None:
    # Arrange
    row, column = TINY.row("fedavg"), TINY.column("path")

    # Act
    values = cell_overrides(TINY, row, column)
    cw = cell_overrides(TINY, TINY.row("cwfedavg"), column)

    # Assert: the preset's protocol, the column's data, the row's algorithm without the preset's params
    assert values["train.batch_size"] == 10 and values["train.lr"] == 0.005 and values["data.seed"] == 1
    assert values["data.dataset"] == "synthetic" and values["engine.eval_initial"] is True
    assert values["algorithm.name"] == "fedavg" and not any(k.startswith("algorithm.params") for k in values)
    assert cw["algorithm.params.wdr_lambda"] == 10.0 and cw["algorithm.params.classwise_blocks"] == 1


def test_a_table_declared_as_data_runs_end_to_end(
    tiny_table: Table, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Arrange
    out = tmp_path / "out"

    # Act
    code = _reproduce(out, "--at-rounds", "0,1,2")

    # Assert: the Markdown, the JSON and the figure, with every runnable cell run once
    assert code == 0
    markdown = (out / "tiny-test.md").read_text()
    assert "| FedAvg (global) | " in markdown and " ± " in markdown and "[2/2; r" in markdown and "98.08" in markdown
    assert "| Not yet written (personalised) | not available in this version | 12.34 |" in markdown
    assert "algorithm no_such_algorithm not available in this version" in markdown
    assert "round 0 | round 1 | round 2 | scored | scored: seed range" in markdown
    assert "| cwFedAvg (Output) | personalised models (`accuracy`), best round | fidelity=code | – |" in markdown
    runs = json.loads((out / "tiny-test.json").read_text())["runs"]
    fedavg_best = sorted(r["best"] for r in runs if r["row"] == "fedavg")
    assert f"| {fedavg_best[0]:.2f} – {fedavg_best[1]:.2f} |" in markdown
    assert sorted((r["row"], r["seed"]) for r in runs) == [
        ("cwfedavg", 0),
        ("cwfedavg", 1),
        ("fedavg", 0),
        ("fedavg", 1),
    ]
    assert all(r["at"]["0"] == runs[0]["at"]["0"] for r in runs if r["seed"] == runs[0]["seed"])  # same init
    for r in runs:  # a round's median wall time, the initial evaluation (round -1) left out
        recorded = pq.read_table(Path(r["run_dir"]) / "rounds.parquet").to_pylist()
        assert r["seconds_per_round"] == np.median([x["round_s"] for x in recorded if x["round"] >= 0])
        assert f"| {r['seconds_per_round']:.1f} | {Path(r['run_dir']).name} |" in markdown
    assert (out / "figures" / "tiny-test-path.png").stat().st_size > 1000
    assert len(list((out / "runs").iterdir())) == 4
    assert capsys.readouterr().out.count(": ran ") == 4


class _StopAfterFirstRound(Callback):
    def after_round(self, run: object, record: object, clients: object) -> bool:
        raise KeyboardInterrupt


def test_an_interrupted_reproduce_resumes_without_repeating_finished_runs(
    tiny_table: Table, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Arrange: FedAvg finished; cwFedAvg seed 0 stopped by Ctrl-C after its first round
    out = tmp_path / "out"
    assert _reproduce(out, "--methods", "fedavg", "--no-figures") == 0
    cells = {(c.row.key, c.seed): c for c in plan(TINY, out, rounds=2, seeds=[0, 1])}
    assert "Written by `rayfed reproduce tiny-test --rounds 2" in (out / "tiny-test.md").read_text()
    stopped = cells[("cwfedavg", 0)]
    assert stopped.config is not None and stopped.run_dir is not None
    with pytest.raises(RunInterrupted):
        rayfed.run(stopped.config, callbacks=[_StopAfterFirstRound()])
    finished = [cells[("fedavg", s)].run_dir / "summary.json" for s in (0, 1)]
    kept = {p: p.stat().st_mtime_ns for p in [*finished, stopped.run_dir / "clients" / "round_000000.parquet"]}
    capsys.readouterr()

    # Act
    assert _reproduce(out, "--no-figures") == 0

    # Assert: finished runs skipped, the stopped one resumed after its first round, the last one ran
    printed = capsys.readouterr().out
    assert printed.count("skipped") == 2 and "cwfedavg path seed 0: resumed" in printed
    assert "cwfedavg path seed 1: ran" in printed
    assert {p: p.stat().st_mtime_ns for p in kept} == kept
    assert "[2/2; r" in (out / "tiny-test.md").read_text().split("| cwFedAvg (Output) |")[1]


def test_more_rounds_extend_finished_runs(
    tiny_table: Table, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Arrange
    out = tmp_path / "out"
    assert (
        main(
            [
                "reproduce",
                TINY.name,
                "--rounds",
                "1",
                "--seeds",
                "1",
                "--methods",
                "fedavg",
                "--out",
                str(out),
                "--no-figures",
            ]
        )
        == 0
    )
    capsys.readouterr()

    # Act
    assert (
        main(
            [
                "reproduce",
                TINY.name,
                "--rounds",
                "2",
                "--seeds",
                "1",
                "--methods",
                "fedavg",
                "--out",
                str(out),
                "--no-figures",
            ]
        )
        == 0
    )

    # Assert
    assert "fedavg path seed 0: extended" in capsys.readouterr().out
    assert len(list((out / "runs").iterdir())) == 1


def test_unknown_table_and_columns_are_refused(
    tiny_table: Table, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Act
    bad_table = main(["reproduce", "tiny-tset", "--out", str(tmp_path)])
    bad_column = main(["reproduce", TINY.name, "--columns", "prac", "--out", str(tmp_path)])

    # Assert
    err = capsys.readouterr().err
    assert bad_table == 2 and "did you mean 'tiny-test'" in err
    assert bad_column == 2 and "--columns: prac not in table tiny-test" in err


def test_a_gpu_share_without_a_gpu_is_refused_before_any_cell_is_planned(
    tiny_table: Table, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    code = main(["reproduce", TINY.name, "--gpus-per-run", "0.5", "--out", str(tmp_path / "out")])

    err = capsys.readouterr().err
    assert code == 2 and "--gpus-per-run 0.5 but this machine has no CUDA GPU" in err and "data" not in err
    assert not (tmp_path / "out").exists()


def test_missing_data_is_listed_with_the_command_that_fetches_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Arrange: MNIST in an empty data folder
    empty = tmp_path / "data"
    empty.mkdir()

    # Act
    code = main(
        [
            "reproduce",
            "cwfedavg-mnist",
            "--rounds",
            "1",
            "--seeds",
            "1",
            "--methods",
            "fedavg",
            "--data-root",
            str(empty),
            "--out",
            str(tmp_path / "out"),
            "--no-figures",
        ]
    )

    # Assert
    markdown = (tmp_path / "out" / "cwfedavg-mnist.md").read_text()
    assert code == 1 and "Columns whose data are missing" in markdown
    printed = capsys.readouterr()
    assert "rayfed: error: 2 cells could not run (data missing)" in printed.err
    assert "MNIST/raw/'" in printed.out and "raw'/" not in printed.out  # the folder to copy into, quoted whole
    assert "Path MNIST" in markdown and 'load_dataset("mnist"' in markdown and "download=True" in markdown


def test_every_declared_table_plans_without_error() -> None:
    # Act / Assert: every row and column composes into a config or a stated reason
    for table in TABLES.values():
        for cell in plan(table, Path("/nonexistent"), rounds=1, seeds=[0], data_root="/data"):
            assert (cell.config is None) == bool(cell.blocked), (table.name, cell.row.key, cell.blocked)


def test_presets_set_the_papers_protocol() -> None:
    # Act
    config = rayfed.RunConfig().override({"engine.backend": "local"})
    from rayfed.config.args import config_from_args

    preset = config_from_args(["train.rounds=30", "algorithm.name=fedavg"], preset="cwfedavg-mnist")

    # Assert
    assert config.engine.eval_initial is False
    assert (preset.data.dataset, preset.data.num_clients, preset.data.seed, preset.data.train_fraction) == (
        "mnist",
        20,
        1,
        0.75,
    )
    assert (preset.train.batch_size, preset.train.lr, preset.train.rounds) == (10, 0.005, 30)
    assert preset.algorithm.name == "fedavg" and preset.engine.eval_initial is True


def test_a_cell_stopped_short_of_its_rounds_reports_its_progress(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayfed.reproduce.report import _progress, rounds_recorded

    # Arrange: a run stopped after 3 training rounds (with the initial model's row -1), and one never started.
    stopped, fresh = tmp_path / "stopped", tmp_path / "fresh"
    stopped.mkdir()
    pq.write_table(pa.table({"round": [-1, 0, 1, 2], "accuracy": [0.1, 0.5, 0.6, 0.7]}), stopped / "rounds.parquet")
    cell = type("CellStub", (), {"run_dir": stopped})()
    never = type("CellStub", (), {"run_dir": fresh})()
    # Act / Assert
    assert rounds_recorded(stopped) == 3 and rounds_recorded(fresh) == 0
    assert _progress([never, cell], 20) == "3 of 20 rounds so far"
    assert _progress([never], 20) == "not run"


def test_a_gpu_share_per_run_is_the_runs_engine_setting_and_keeps_its_run_directory(
    tiny_table: Table, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: the cells the command line plans with --gpus-per-run 0.125, and without.
    planned: dict[str, list[Cell]] = {}

    def record(cells, **_: object) -> dict:
        planned["cells"] = list(cells)
        return {}

    monkeypatch.setattr("rayfed.reproduce.packed_runs.execute_packed", record)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # the runs are planned, not trained
    plain = plan(TINY, tmp_path / "out", rounds=2, seeds=[0, 1])
    # Execute
    assert _reproduce(tmp_path / "out", "--gpus-per-run", "0.125", "--parallel", "8", "--no-figures") == 0
    # Assert: every run trains on its 1/8 of a GPU (its Ray task asks for that), in the same run directory.
    shares = {cell.config.engine.num_gpus_per_worker for cell in planned["cells"] if cell.config is not None}
    assert shares == {0.125}
    assert [c.config.run_dir for c in planned["cells"] if c.config] == [c.config.run_dir for c in plain if c.config]


def test_each_row_is_scored_on_the_model_it_reports_and_the_report_names_it(tmp_path: Path) -> None:
    # Arrange: finished runs with hand-written curves; FedAvg reports its one model, FedNH its global model,
    # FedUV its clients' models after local training, and one row the round of lowest test loss.
    table = Table(
        "models-test",
        "rows reporting different models",
        "a test table",
        columns=TINY.columns,
        rows=(
            Row("fedavg", "FedAvg", "fedavg"),
            Row("fednh", "FedNH", "fednh", evaluates="global"),
            Row("feduv", "FedUV", "feduv", evaluates="local", choices="a choice"),
            Row("fedavg_loss", "FedAvg at lowest loss", "fedavg", select="lowest_test_loss"),
        ),
    )
    cells = plan(table, tmp_path, rounds=3, seeds=[0])
    curves = {
        "accuracy": [0.5, 0.7, 0.6],
        "global_accuracy": [0.4, 0.45, 0.9],
        "local_accuracy": [0.8, 0.95, 0.9],
        "test_loss": [1.0, 0.8, 0.5],
    }
    for cell in cells:
        cell.run_dir.mkdir(parents=True, exist_ok=True)  # the two FedAvg rows share their runs
        rows = [{"round": t, "round_s": 1.0, **{k: v[t] for k, v in curves.items()}} for t in range(3)]
        pq.write_table(pa.Table.from_pylist(rows), cell.run_dir / "rounds.parquet")
        (cell.run_dir / "summary.json").write_text(json.dumps({"rounds_run": 3}))
    # Act
    markdown = write_report(table, cells, tmp_path, rounds=3).read_text()
    # Assert: each row's score and round, its model in the header and beside its name; FedUV's cell measures
    # the local models (engine.eval_local, which enters the run's name).
    scores = {
        r["row"]: (r["best"], r["best_round"]) for r in json.loads((tmp_path / "models-test.json").read_text())["runs"]
    }
    assert scores == {"fedavg": (70.0, 2), "fednh": (90.0, 3), "feduv": (95.0, 2), "fedavg_loss": (60.0, 3)}
    assert "| FedAvg | global model (`accuracy`), best round | – | – |" in markdown
    assert "| FedNH | global model (`global_accuracy`), best round | – | – |" in markdown
    feduv_line = "| FedUV | clients' models after local training (`local_accuracy`), best round | fidelity=code |"
    assert f"{feduv_line} a choice |" in markdown
    assert "| FedAvg at lowest loss | global model (`accuracy`), round of lowest test loss |" in markdown
    assert "| FedNH (global) | 90.00 [1/1; r3] |" in markdown
    feduv = next(c for c in cells if c.row.key == "feduv").config
    assert feduv is not None and feduv.engine.eval_local and not cells[0].config.engine.eval_local
    assert run_dir_name(feduv) != run_dir_name(feduv.override({"engine.eval_local": False}))


def test_fields_added_and_values_renamed_keep_the_names_of_committed_runs() -> None:
    # The runs behind the committed reports (benchmarks/results/*-curves) are found by name: a new field at its
    # default (model.init, CFL's norms) and KT-pFL's fidelity renamed code -> corrected leave the names as they were.
    results = Path(__file__).parents[2] / "benchmarks" / "results"
    cases = [
        ("pfl-baselines-mnist", "fednh", None, "pfl-baselines-mnist-curves"),
        ("pfl-baselines-mnist", "fedamp", None, "pfl-baselines-mnist-curves"),
        ("fedclassavg-t2", "ktpfl_e1", "offline_dir", "fedclassavg-t2-curves"),
        ("fedawa-mnist", "fedadam", "mnist01", "fedawa-mnist-curves"),
    ]
    for table, row, column, curves in cases:
        cells = plan(
            TABLES[table],
            Path("/tmp/unused"),
            rounds=20,
            seeds=[0, 1],
            rows=[row],
            columns=[column] if column else None,
        )
        names = {cell.run_dir.name for cell in cells if cell.run_dir is not None}
        assert names and names <= {p.name for p in (results / curves).iterdir()}, (table, row, names)


@pytest.mark.parametrize("table", ["cwfedavg-mnist", "fedawa-mnist", "fedclassavg-t2", "pfl-baselines-mnist"])
def test_every_run_of_a_committed_report_is_committed_under_the_name_its_cell_has_today(table: str) -> None:
    # Each run a committed report (benchmarks/results/TABLE.json) scores is in a *-curves folder, under the name the
    # table's cell gives it now: regenerating the report with --report-only finds every one of them.
    results = Path(__file__).parents[2] / "benchmarks" / "results"
    report = json.loads((results / f"{table}.json").read_text())
    committed = {p.name for p in results.glob("*-curves/*")}
    cells = plan(
        TABLES[table],
        Path("/tmp/unused"),
        rounds=report["rounds"],
        seeds=sorted({run["seed"] for run in report["runs"]}),
        rows=sorted({run["row"] for run in report["runs"]}),
        columns=sorted({run["column"] for run in report["runs"]}),
    )
    name_of = {(c.row.key, c.column.key, c.seed): c.run_dir.name for c in cells if c.run_dir is not None}
    for run in report["runs"]:
        name = Path(run["run_dir"]).name
        assert name in committed and name_of[run["row"], run["column"], run["seed"]] == name, run


def test_every_cell_of_the_committed_mnist_baselines_report_has_its_run_committed() -> None:
    # The committed pfl-baselines-mnist report (20 rounds, seeds 0 and 1) rests on runs whose configs are the
    # table's today: FedAvg's and cwFedAvg's from cwfedavg-mnist's curves, every other row's from its own.
    results = Path(__file__).parents[2] / "benchmarks" / "results"
    committed = {
        p.name
        for curves in ("pfl-baselines-mnist-curves", "cwfedavg-mnist-curves")
        for p in (results / curves).iterdir()
    }
    cells = plan(TABLES["pfl-baselines-mnist"], Path("/tmp/unused"), rounds=20, seeds=[0, 1])
    names = {cell.run_dir.name for cell in cells if cell.run_dir is not None}
    assert len(names) == 2 * 2 * len(TABLES["pfl-baselines-mnist"].rows)
    assert names - committed == set()


def test_a_table_run_with_privacy_carries_the_epsilon_it_spent(tmp_path: Path) -> None:
    # Arrange: two seeds of a private FedAvg whose rounds.parquet records ε after each round (seed 1 spent more)
    table = Table(
        "private-test",
        "a private table",
        "a test table",
        columns=TINY.columns,
        rows=(Row("fedavg", "FedAvg", "fedavg"),),
    )
    cells = plan(table, tmp_path, rounds=3, seeds=[0, 1])
    for cell in cells:
        cell.run_dir.mkdir(parents=True, exist_ok=True)
        spent = [1.0, 2.0, 3.0, 4.0] if cell.seed == 0 else [1.5, 2.5, 3.5, 4.5]  # a 4th round is past the table's
        rows = [{"round": t, "round_s": 1.0, "accuracy": 0.5, "epsilon": spent[t]} for t in range(4)]
        pq.write_table(pa.Table.from_pylist(rows), cell.run_dir / "rounds.parquet")
    # Act
    markdown = write_report(table, cells, tmp_path, rounds=3).read_text()
    # Assert: ε after round 3 in the cell (the most of any seed), per run, and in the JSON
    assert "[2/2; r1; ε=3.5]" in markdown
    assert "| s/round | ε | run directory |" in markdown and "| 1.0 | 3 |" in markdown
    runs = json.loads((tmp_path / "private-test.json").read_text())["runs"]
    assert sorted(r["epsilon"] for r in runs) == [3.0, 3.5]
