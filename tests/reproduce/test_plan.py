"""``rayfed reproduce TABLE --plan``: the cells, those done, and their cost here and at the papers' horizon."""

from __future__ import annotations

import dataclasses
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayfed.cli import main
from rayfed.reproduce import TABLES, Column, Row, Table
from rayfed.reproduce.costing import ShapeCost, epoch_schedule, plan_report, round_walls, wall_seconds
from rayfed.reproduce.runner import plan

SMALL = {"data.dataset": "synthetic", "data.options": {"num_samples": 1200}, "data.num_clients": 6}
TABLE = Table(
    name="plan-test",
    title="two methods on the offline dataset",
    source="P-ICCV Table 1",
    columns=(Column("a", "offline", "cwfedavg-mnist", SMALL),),
    rows=(Row("fedavg", "FedAvg", "fedavg"), Row("fedprox", "FedProx", "fedprox", {"mu": 0.01})),
    paper_rounds=1000,
)


def test_longest_cells_go_first_each_to_the_runner_free_soonest() -> None:
    assert wall_seconds([2, 3, 2, 3, 2], slots=2) == 7  # 3+2+2 and 3+2
    assert wall_seconds([5, 1, 1], slots=4) == 5 and wall_seconds([], slots=2) == 0


def test_a_plan_costs_each_cell_from_its_runs_or_a_calibration_and_the_papers_horizon(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    cells = plan(TABLE, tmp_path, rounds=10, seeds=[0, 1])
    # FedAvg seed 0 ran 4 rounds of 3 s (round 0, the warm-up, is not timed); FedProx has no run: calibrated
    # (stubbed: 2 s a round, 5 s to start).
    done = next(c.run_dir for c in cells if c.row.key == "fedavg" and c.seed == 0)
    done.mkdir(parents=True)
    rows = [{"round": t, "round_s": 3.0} for t in range(4)]
    pq.write_table(pa.Table.from_pylist(rows), done / "rounds.parquet")
    calibrated = []

    def calibrate(cell):
        calibrated.append(cell.row.key)
        return ShapeCost(2.0, 5.0, "stub")

    report = plan_report(TABLE, cells, rounds=10, parallel=4, gpus_per_run=0.0, calibrate=calibrate)

    assert calibrated == ["fedprox"]  # one calibration per row x column, none where a run timed it
    lines = report.splitlines()
    assert "fedavg" in lines[1] and "4/10" in lines[1] and " 18 " in lines[1] and "its runs (3 rounds)" in lines[1]
    assert "fedavg" in lines[2] and "0/10" in lines[2] and " 30 " in lines[2]  # 10 rounds of 3 s, no start known
    assert " 25 " in lines[3] and "stub" in lines[3]  # FedProx: 10 x 2 s + 5 s
    # 18 + 30 + 25 + 25 s over min(--parallel 4, 2 CPUs) = 2 runners: 30 + 18 | 25 + 25
    assert lines[-1].startswith(
        "plan: cells=4 to_run=4 work_s=98 wall_s=50 paper_run_hours=4.2 paper_wall_hours=2.2 paper_packed_hours=4.2 "
    )
    # the papers: 3 x 3,000 s + 3 x 2,005 s = 15,015 s; on 2 runners 3,000 + 3,000 + 2,005 | 3,000 + 2,005 + 2,005
    assert "the papers' horizon (1000 rounds, 3 seeds, 6 runs of the 2 costed shapes" in report


def test_plan_on_the_command_line_calibrates_and_writes_no_run(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(TABLES, TABLE.name, dataclasses.replace(TABLE, rows=TABLE.rows[:1]))
    code = main(["reproduce", TABLE.name, "--plan", "--rounds", "5", "--seeds", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and out.count("calibrated here (2 rounds)") == 2, out
    assert out.splitlines()[-1].startswith("plan: cells=2 to_run=2 ")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_table_plans_and_costs_its_cells(name, tmp_path, monkeypatch) -> None:
    # No calibration here (a stub): every registered table's runnable cells are planned and costed.
    cells = plan(TABLES[name], tmp_path, rounds=20, seeds=[0])
    report = plan_report(
        TABLES[name], cells, rounds=20, parallel=1, gpus_per_run=0.0, calibrate=lambda cell: ShapeCost(1.0, 0.0, "s")
    )
    assert report.splitlines()[-1].startswith(f"plan: cells={sum(c.config is not None for c in cells)} ")
    # every table has a horizon to cost: its paper's rounds, or its authors' code's where the paper states none
    assert f"the papers' horizon ({TABLES[name].paper_rounds} rounds, " in report and TABLES[name].paper_rounds > 0


RAMP = Table(
    name="plan-ramp",
    title="KT-pFL with its local epochs growing by one a round up to 4",
    source="P-FCA Table 2",
    columns=(Column("a", "offline", "cwfedavg-mnist", SMALL),),
    rows=(Row("ktpfl", "KT-pFL", "ktpfl", {"max_local_epochs": 4, "public_dataset": ""}),),
    paper_rounds=10,
)


def _timed_rounds(run_dir, seconds: list[float]) -> None:
    run_dir.mkdir(parents=True)
    rows = [{"round": t, "round_s": s} for t, s in enumerate(seconds)]
    pq.write_table(pa.Table.from_pylist(rows), run_dir / "rounds.parquet")


def test_rounds_whose_epochs_grow_cost_a_fixed_part_and_a_part_per_epoch(tmp_path) -> None:
    # Rounds 0-3 train 1, 1, 2, 3 epochs (round 0 is the code's one-epoch start); each takes 10 s + 4 s an epoch.
    cells = plan(RAMP, tmp_path, rounds=8, seeds=[0, 1])
    assert epoch_schedule(cells[0], range(8)) == [1, 1, 2, 3, 4, 4, 4, 4]
    _timed_rounds(cells[0].run_dir, [99.0, 14.0, 18.0, 22.0])
    stub = ShapeCost(1.0, 0.0, "never called")

    report = plan_report(RAMP, cells, rounds=8, parallel=1, gpus_per_run=0.0, calibrate=lambda cell: stub)

    lines = report.splitlines()
    # seed 0: rounds 4-7, 4 x (10 + 16) s; seed 1 from scratch: 8 x 10 + 4 x (1+1+2+3+4+4+4+4) = 172 s
    assert " 104 " in lines[1] and "4.0 s per local epoch" in lines[1], lines[1]
    assert " 172 " in lines[2], lines[2]
    # the papers: 3 seeds x (10 rounds x 10 s + 4 x (1+1+2+3+4 x 6)) = 3 x 224 s
    assert " paper_run_hours=0.2 paper_wall_hours=0.2 " in lines[-1] and "work_s=276" in lines[-1]


def test_a_ramp_timed_at_one_epoch_count_is_called_a_lower_bound(tmp_path) -> None:
    cells = plan(RAMP, tmp_path, rounds=8, seeds=[0])
    _timed_rounds(cells[0].run_dir, [99.0, 14.0])  # round 1 alone: one epoch

    report = plan_report(RAMP, cells, rounds=8, parallel=1, gpus_per_run=0.0, calibrate=lambda cell: None)

    assert "timed at one count: a lower bound" in report.splitlines()[1]


def test_a_round_costs_its_time_plus_its_files_and_not_a_pause_between_a_stop_and_a_resume(tmp_path) -> None:
    # Four rounds of 10 s each; the files of a round take 2 s; the run stopped for 80 s after round 1.
    run_dir = tmp_path / "run"
    _timed_rounds(run_dir, [10.0] * 4)
    (run_dir / "clients").mkdir()
    for t, written in enumerate([1_000.0, 1_012.0, 1_104.0, 1_116.0]):
        table = run_dir / "clients" / f"round_{t:06d}.parquet"
        table.write_bytes(b"")
        os.utime(table, (written, written))

    assert round_walls(run_dir) == [(1, 12.0), (2, 12.0), (3, 12.0)]
