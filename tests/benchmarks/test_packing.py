"""``benchmarks/packing.py`` on tiny settings: its last line has every key, packing fills the MNIST protocol's lanes
(0.565 and 0.359 with one lane a client), a run packed into lanes and runs packed into one stack keep their numbers,
runs merged into one stack issue fewer operations per client-step, a pack of runs whose partitions come from their
own seeds fills its lanes, and the exact layouts bound what packing can reach."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import packing  # noqa: E402

from rayfed.train.lanes import occupancy, one_lane_each, packed_lanes  # noqa: E402


def test_packing_prints_its_keys_and_fills_the_lanes(capsys: pytest.CaptureFixture[str]) -> None:
    assert packing.main(["--rounds", "1", "--clients", "8", "--runs", "4"]) == 0
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
        "occupancy_k8_seeds_dirichlet",
    ]
    before = {k: occupancy(one_lane_each(v)) for k, v in packing.MNIST_STEPS.items()}
    assert round(before["dirichlet"], 3) == 0.565 and round(before["pathological"], 3) == 0.359
    assert float(values["occupancy_dirichlet"]) >= 0.94
    assert float(values["occupancy_pathological"]) >= 0.95
    assert values["packed_equal"] == "1"
    assert float(values["ops_k8_vs_k1"]) < 0.5  # 4 runs merged: about a quarter of one run's operations a step
    assert float(values["cpu_k4_packed_vs_side_by_side"]) > 0
    assert float(values["occupancy_k8_seeds_dirichlet"]) >= 0.95  # one run's sizes stop at 0.941: see below


def test_packed_numbers_are_compared_within_the_tolerance() -> None:
    row = {"round": 0, "accuracy": 0.5, "test_loss": 1.0}
    assert packing.agree([row], [dict(row)])
    assert not packing.agree([row], [{**row, "test_loss": 1.001}])


def test_the_exact_layout_is_never_worse_than_multifit() -> None:
    from packed_runs import best_occupancy, exact_lanes

    steps = (9, 7, 6, 5, 5, 4, 2)
    assert exact_lanes(steps, 2) == 19  # 9+6+4 and 7+5+5+2: the total 38 over two lanes
    assert exact_lanes(steps, 1) == 38
    for counts in packing.MNIST_STEPS.values():
        assert best_occupancy(counts, 0.05)[0] >= occupancy(packed_lanes(counts)) - 1e-12


def test_one_runs_sizes_are_bounded_below_the_target_and_a_pack_of_seeds_passes_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dirichlet = packing.MNIST_SEED_STEPS["dirichlet"]
    assert packing.MNIST_STEPS["dirichlet"] == dirichlet[0]
    lanes, bound = packing.no_slack_bound(dirichlet[0])
    assert (lanes, round(bound, 3)) == (12, 0.941)  # 5,240 steps over >= 12 lanes of >= 464 steps
    assert round(occupancy(packed_lanes(dirichlet[0])), 3) == 0.941  # packing reaches it; the exact search too
    assert packing.seeds_rows(dirichlet) >= 0.95
    rows = capsys.readouterr().out.splitlines()
    assert [row.split()[0] for row in rows] == [str(k) for k in packing.PACK_RUNS]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RAYFED_TEST_DATA"), reason="needs real MNIST in RAYFED_TEST_DATA")
def test_the_step_counts_are_those_the_partitioners_give_on_real_mnist() -> None:
    assert packing.mnist_steps(os.environ["RAYFED_TEST_DATA"]) == packing.MNIST_SEED_STEPS
