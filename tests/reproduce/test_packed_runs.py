"""``rayfed reproduce --parallel P``: cells that may share one stack train packed through ``rayfed.run_many``, and
give the numbers they give alone; the others, and every cell on a CPU by default, run as before."""

from __future__ import annotations

import dataclasses

import pyarrow.parquet as pq
import pytest

import rayfed
import rayfed.packs
from rayfed.cli import main
from rayfed.execution import stack_merger
from rayfed.reproduce import TABLES
from rayfed.reproduce import packed_runs as packed
from rayfed.reproduce.runner import Outcome, plan
from tests.reproduce.test_plan import TABLE

ONE_ROW = dataclasses.replace(TABLE, rows=TABLE.rows[:1])
STACKED = {"engine.vectorize": "on"}


def test_on_a_cpu_by_default_nothing_packs_and_the_line_says_why(tmp_path) -> None:
    cells = plan(TABLE, tmp_path, rounds=2, seeds=[0, 1])
    packs, alone, line = packed.split_packs(cells, parallel=4)
    assert packs == [] and alone == cells
    assert line.startswith("alone (engine.vectorize='auto' trains its clients one at a time on the CPU")
    assert packed.split_packs(cells, parallel=1) == ([], cells, "")


def test_with_the_stacked_path_on_each_row_and_columns_seeds_pack_at_most_parallel_at_once(tmp_path) -> None:
    cells = plan(TABLE, tmp_path, rounds=2, seeds=[0, 1, 2], settings=STACKED)
    packs, alone, line = packed.split_packs(cells, parallel=2)
    assert [[(c.row.key, c.seed) for c in pack] for pack in packs] == [
        [("fedavg", 0), ("fedavg", 1)],
        [("fedprox", 0), ("fedprox", 1)],
    ]
    assert [(c.row.key, c.seed) for c in alone] == [("fedavg", 2), ("fedprox", 2)]
    assert line == "packed fedavg x a s0,1,2; packed fedprox x a s0,1,2"


def test_a_pack_that_raises_brings_each_of_its_cells_to_its_rounds_alone(tmp_path, monkeypatch) -> None:
    cells = plan(ONE_ROW, tmp_path, rounds=2, seeds=[0, 1], settings=STACKED)

    def fails(configs, **kwargs):
        raise RuntimeError("a plugin failed in one run")

    monkeypatch.setattr(rayfed.packs, "run_many", fails)
    monkeypatch.setattr(packed, "run_cell", lambda config, accepted: Outcome("ran", f"alone {config.seed}"))
    outcomes = packed.run_pack(cells, [])
    assert [outcomes[c].message for c in cells] == ["alone 0", "alone 1"]


@pytest.mark.slow
def test_reproduce_parallel_trains_a_rows_seeds_packed_with_the_numbers_they_give_alone(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setitem(TABLES, ONE_ROW.name, ONE_ROW)
    merged: list[int] = []  # the sizes of the groups of runs' stacks trained as one
    merge = stack_merger.StackMerger._merge

    def counted(self: stack_merger.StackMerger, group: list) -> bool:
        done = merge(self, group)
        merged.extend([len(group)] * done)
        return done

    monkeypatch.setattr(stack_merger.StackMerger, "_merge", counted)
    words = ["reproduce", ONE_ROW.name, "--rounds", "2", "--seeds", "2", "--parallel", "2", "--no-figures"]
    stacked = ["--set", "engine.vectorize=on", "--set", "engine.clients_per_call=6"]  # one call: a stack of 6
    code = main([*words, *stacked, "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0 and "packs: packed fedavg x a s0,1" in out, out
    assert out.count("ran 2 rounds, best ") == 2 and out.count(", packed with 2") == 2, out
    assert merged and max(merged) == 2  # the two seeds trained their stacks as one
    settings = {**STACKED, "engine.clients_per_call": 6}
    for cell in plan(ONE_ROW, tmp_path / "out", rounds=2, seeds=[0, 1], settings=settings):
        assert cell.config is not None and cell.run_dir is not None
        alone = rayfed.run(cell.config.override({"run_dir": str(tmp_path / f"alone-{cell.seed}")}))
        packed_rounds = pq.read_table(cell.run_dir / "rounds.parquet").to_pylist()
        alone_rounds = pq.read_table(alone.run_dir / "rounds.parquet").to_pylist()
        assert [r["accuracy"] for r in packed_rounds] == pytest.approx([r["accuracy"] for r in alone_rounds], abs=0.02)
        assert [r["train_loss"] for r in packed_rounds] == pytest.approx(
            [r["train_loss"] for r in alone_rounds], rel=1e-4, nan_ok=True
        )
