"""``benchmarks/packing.py`` on tiny settings: its last line has every key, packing fills the MNIST protocol's lanes
(0.565 and 0.359 with one lane a client), a run packed into lanes keeps its numbers, and the parts not built print
``na``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import packing  # noqa: E402

from rayfed.train.lanes import occupancy, one_lane_each  # noqa: E402


def test_packing_prints_its_keys_and_fills_the_lanes(capsys: pytest.CaptureFixture[str]) -> None:
    assert packing.main(["--rounds", "1", "--clients", "8"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    name, _, pairs = last.partition(": ")
    values = dict(pair.split("=") for pair in pairs.split())
    assert name == "packing"
    assert list(values) == [
        "occupancy_dirichlet",
        "occupancy_pathological",
        "ops_k8_vs_k1",
        "packed_equal",
        "cpu_k4_packed_vs_side_by_side",
    ]
    before = {k: occupancy(one_lane_each(v)) for k, v in packing.MNIST_STEPS.items()}
    assert round(before["dirichlet"], 3) == 0.565 and round(before["pathological"], 3) == 0.359
    assert float(values["occupancy_dirichlet"]) >= 0.94
    assert float(values["occupancy_pathological"]) >= 0.95
    assert values["packed_equal"] == "1"
    assert values["ops_k8_vs_k1"] == values["cpu_k4_packed_vs_side_by_side"] == "na"


def test_packed_numbers_are_compared_within_the_tolerance() -> None:
    row = {"round": 0, "accuracy": 0.5, "test_loss": 1.0}
    assert packing.agree([row], [dict(row)])
    assert not packing.agree([row], [{**row, "test_loss": 1.001}])
