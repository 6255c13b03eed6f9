"""``benchmarks/packed_round.py`` on the CPU with tiny settings: its last line and JSON hold every figure, positive,
with the device's name; the hours follow the table's horizon; without CUDA and without ``--tiny`` it measures
nothing. No seconds are asserted: the tiny run's times mean nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import packed_round  # noqa: E402

from rayfed.reproduce import TABLES  # noqa: E402


@pytest.mark.slow
def test_the_tiny_run_prints_and_writes_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "packed_round.json"
    assert packed_round.main(["--tiny", "--quick", "--runs", "3", "--out", str(out)]) == 0
    name, _, pairs = capsys.readouterr().out.strip().splitlines()[-1].partition(": ")
    values = dict(pair.split("=") for pair in pairs.split())
    assert name == "packed_round"
    assert values.pop("device") == "cpu"
    keys = [
        "s_per_run_round_alone",
        "s_per_run_round_packed_k3",
        "packed_over_alone",
        "table_mnist_hours_alone",
        "table_mnist_hours_packed_k3",
    ]
    assert list(values) == keys
    assert all(float(value) > 0 for value in values.values())
    record = json.loads(out.read_text())
    assert record["device"] == "cpu" and record["table"] == "cwfedavg-iccv-t1" and record["column"] == "prac_mnist"
    assert list(record["summary"]) == keys and all(value > 0 for value in record["summary"].values())
    table = TABLES["cwfedavg-iccv-t1"]
    assert record["rows"] == len(table.rows)  # every row of the MNIST column runs in this version
    hours = packed_round.horizon_hours(table, record["rows"], record["summary"]["s_per_run_round_alone"])
    assert record["summary"]["table_mnist_hours_alone"] == pytest.approx(hours)


def test_the_hours_are_rows_seeds_rounds_and_seconds() -> None:
    table = TABLES["cwfedavg-iccv-t1"]
    assert (table.paper_seeds, table.paper_rounds) == (3, 1000)
    assert packed_round.horizon_hours(table, 2, 1.8) == pytest.approx(2 * 3 * 1000 * 1.8 / 3600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="measures on the GPU where there is one")
def test_without_cuda_it_measures_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert packed_round.main([]) == 0
    assert capsys.readouterr().out.strip() == packed_round.NO_GPU


def test_too_few_runs_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        packed_round.main(["--tiny", "--runs", "1"])
    assert "--runs=1 is too small; give at least 2" in capsys.readouterr().err
