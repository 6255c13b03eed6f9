"""``--plan`` with packing: which cells pack, and the papers' horizon packed, here and estimated on a GPU."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayfed.reproduce.costing import ShapeCost, plan_report, shape_costs
from rayfed.reproduce.packed_cost import GPU_RECORD, pack_ratio, round_steps, step_factor
from rayfed.reproduce.runner import plan
from tests.reproduce.test_plan import TABLE

# 20 clients' local steps in a round, longest 464 (the MNIST protocol's Dirichlet 0.1 call has 5,240 in all)
STEPS = (37, 38, 60, 90, 120, 150, 180, 200, 230, 250, 270, 300, 330, 350, 394, 420, 430, 440, 450, 464)


def test_a_step_costs_the_same_up_to_40_lanes_then_grows_with_its_width() -> None:
    assert step_factor(1) == step_factor(40) == 1.0 and step_factor(60) == 1.5


def test_runs_packed_share_lanes_within_a_stack_and_a_stack_size() -> None:
    # alone each run takes 10 stacked steps on 3 lanes; two packed fill 4 lanes of 10 steps in one stack
    assert round_steps([[10, 5, 5], [10, 5, 5]], stack_size=64) == 10 and pack_ratio([[10, 5, 5]] * 2, 64) == 0.5
    wide = [[10] * 30, [10] * 30]
    assert pack_ratio(wide, stack_size=64) == 0.75  # 60 lanes: a step 1.5 times one of 40
    assert pack_ratio(wide, stack_size=40) == 1.0  # the second run's 30 lanes do not fit: a stack after the first


def _report(tmp_path, table=TABLE, steps=STEPS) -> list[str]:
    cells = plan(table, tmp_path, rounds=10, seeds=[0, 1, 2])
    stub = ShapeCost(2.0, 0.0, "stub", steps=steps)
    return plan_report(table, cells, rounds=10, parallel=1, gpus_per_run=0.0, calibrate=lambda cell: stub).splitlines()


def test_on_the_cpu_nothing_packs_and_the_gpu_estimate_prices_the_horizon_from_the_recorded_round(tmp_path) -> None:
    lines = _report(tmp_path)
    here = next(line for line in lines if line.startswith("packs here: "))
    assert here == (
        "packs here: alone (engine.vectorize='auto' trains its clients one at a time on the CPU, where stacking "
        "does not pay): fedavg x a s0,1,2 + fedprox x a s0,1,2"
    )
    assert "on a GPU: packed fedavg x a s0,1,2; packed fedprox x a s0,1,2" in lines
    estimate = next(line for line in lines if line.startswith("GPU estimate from NVIDIA H200, 2026-11-28: 1.109 s"))
    assert "for 2 of the 2 costed shapes" in estimate
    fields = dict(item.split("=") for item in lines[-1].split()[1:])
    # alone: 464 steps x 1.019 / 464 s + 0.090 s = 1.109 s a run-round, x 1,000 rounds x 3 seeds x 2 shapes
    assert float(fields["gpu_estimate_alone_hours"]) == pytest.approx(1.109 * 6000 / 3600, abs=0.05)
    # packed: the three seeds' 60 clients in one stack of at most 40 lanes, about 487 stacked steps a round
    assert float(fields["gpu_estimate_hours"]) == pytest.approx((487 * 1.019 / 464 / 3 + 0.090) * 6000 / 3600, abs=0.05)
    assert fields["paper_packed_hours"] == fields["paper_run_hours"]  # the CPU: nothing packed


def test_where_the_stacked_path_is_on_the_plan_packs_here_and_prices_the_horizon_packed(tmp_path) -> None:
    stacked = dataclasses.replace(
        TABLE,
        columns=tuple(dataclasses.replace(c, settings={**c.settings, "engine.vectorize": "on"}) for c in TABLE.columns),
    )
    lines = _report(tmp_path, stacked)
    assert "packs here: packed fedavg x a s0,1,2; packed fedprox x a s0,1,2" in lines
    fields = dict(item.split("=") for item in lines[-1].split()[1:])
    ratio = pack_ratio([STEPS] * 3, 64)
    assert ratio < 0.4 and float(fields["paper_packed_hours"]) == pytest.approx(
        float(fields["paper_run_hours"]) * ratio, abs=0.1
    )
    assert not any(line.startswith("GPU estimate") for line in lines)


def test_shapes_of_other_models_or_without_steps_are_not_estimated(tmp_path) -> None:
    lines = _report(tmp_path, steps=())
    estimate = next(line for line in lines if line.startswith("GPU estimate from "))
    assert "for 0 of the 2 costed shapes (not estimated, another model or its steps unknown: fedavg x a, " in estimate
    assert GPU_RECORD.model == "cnn4"


def test_a_shape_timed_by_its_runs_takes_the_steps_of_their_last_round(tmp_path) -> None:
    cells = plan(TABLE, tmp_path, rounds=10, seeds=[0])
    done = cells[0].run_dir
    (done / "clients").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"round": t, "round_s": 3.0} for t in range(3)]), done / "rounds.parquet")
    for t, steps in ((1, [9, 9, 0]), (2, [4, 0, 7])):  # a client not trained in a round has no steps
        pq.write_table(pa.table({"steps": steps}), done / "clients" / f"round_{t:06d}.parquet")
    costs = shape_costs(cells[:1], calibrate=lambda cell: ShapeCost(1.0, 0.0, "never"))
    assert costs[("fedavg", "a")].steps == (4, 7)
