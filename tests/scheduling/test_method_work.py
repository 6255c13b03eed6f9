"""Each method's own work on the virtual clock (docs/system.md, Eq. 1 and 2): the steps of all its phases and the
bytes of its own messages, and partial work spent on the phase whose result the server receives."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import RunConfig
from rayfed.algorithms.sizing import model_state_bytes
from rayfed.engine import Simulation
from rayfed.engine.metrics import summarise_round
from rayfed.execution.reports import ClientReport
from rayfed.scheduling.sync_rounds import VirtualRounds
from rayfed.system import client_times
from tests.conftest import tiny_overrides

EQUAL = {"system.devices": "equal", "system.step_s": 0.05, "data.partition": "iid", "engine.join_ratio": 0.5}


def _trained(run_dir: Path, rounds: int) -> list[dict]:
    """The per-client rows of the clients whose work counted."""
    rows = [pq.read_table(run_dir / "clients" / f"round_{t:06d}.parquet").to_pylist() for t in range(rounds)]
    return [c for table in rows for c in table if c["status"] in ("finished", "partial")]


@pytest.mark.parametrize("method", ["fedrep", "ditto", "fedper", "fedawa"])
def test_the_clock_charges_the_steps_and_bytes_each_method_trains_and_sends(tmp_path, method) -> None:
    # Execute
    sim = Simulation(RunConfig().override(tiny_overrides(tmp_path, **EQUAL, **{"algorithm.name": method})))
    sim.run()
    # Assert: every counted client was charged the steps it took in all its phases and the bytes it moved
    clients = _trained(tmp_path, 2)
    assert len(clients) == 10
    for c in clients:
        assert c["charged_steps"] == c["trained_steps"] > 0
        assert (c["charged_bytes_down"], c["charged_bytes_up"]) == (c["bytes_down"], c["bytes_up"])
    if method == "fedrep":  # 10 head epochs and a body epoch, all reported: 11 times FedAvg's one epoch
        assert all(c["trained_steps"] == c["steps"] and c["steps"] % 11 == 0 for c in clients)
    if method == "ditto":  # the personal phase does not report its steps, but it trains them: twice the reported
        assert all(c["trained_steps"] == 2 * c["steps"] for c in clients)
    if method in ("fedper", "fedawa"):  # less than a model goes up: FedPer's body; FedAWA's vector is larger
        whole = model_state_bytes(sim.spec)
        assert all((c["bytes_up"] < whole) == (method == "fedper") for c in clients)


def _deadlines(tmp_path: Path, method: str) -> tuple[float, float, float]:
    """On equal devices and clients of equal work: the most time any client needs for its transfers and the phases
    outside the step budget, for those and one budgeted step, and the least time any client's whole round takes."""
    overrides = tiny_overrides(tmp_path / "probe", **EQUAL, **{"algorithm.name": method})
    sim = Simulation(RunConfig().override(overrides))
    assert isinstance(sim.rounds, VirtualRounds)
    rounds = sim.rounds.rounds
    work, ids = rounds.work, np.arange(10)
    times = client_times(rounds.devices, work, ids, step_s=0.05)
    fixed = times.download_s + times.upload_s + (work.steps - work.budgeted_of(ids)) * 0.05
    assert (work.budgeted_of(ids) < work.steps).all()
    return float(fixed.max()), float((fixed + 0.05).max()), float(times.total_s.min())


def _every_client_partial(tmp_path: Path, method: str) -> dict[str, object]:
    """A deadline every client misses but meets with its phases outside the step budget and one step of the
    budgeted ones."""
    _, least, most = _deadlines(tmp_path, method)
    assert least < most
    deadline = {"system.deadline_s": (least + most) / 2, "system.late_work": "partial"}
    return tiny_overrides(tmp_path / "run", **EQUAL, **deadline, **{"algorithm.name": method})


@pytest.mark.parametrize("method", ["fedrep", "ditto"])
def test_partial_clients_train_the_part_the_server_receives(tmp_path, method) -> None:
    # Prepare
    overrides = _every_client_partial(tmp_path, method)
    # Execute
    Simulation(RunConfig().override(overrides)).run()
    # Assert: every counted client partial; its budget went to the uploaded phase, which moved the shared model
    rounds = pq.read_table(tmp_path / "run" / "rounds.parquet").to_pylist()
    assert [r["clients_partial"] for r in rounds] == [5.0, 5.0]
    assert all(math.isfinite(r["train_loss"]) for r in rounds)
    for c in _trained(tmp_path / "run", 2):
        assert c["status"] == "partial" and c["update_norm"] > 0
        assert c["charged_steps"] == c["trained_steps"]


def test_a_client_that_would_train_none_of_the_uploaded_phase_is_late_not_partial(tmp_path) -> None:
    # Prepare: Ditto on spread devices, a deadline by which some clients train only part of their personal model
    spread = {**EQUAL, "system.devices": "lognormal", "system.compute_spread": 1.0, "algorithm.name": "ditto"}
    sim = Simulation(RunConfig().override(tiny_overrides(tmp_path / "probe", **spread)))
    assert isinstance(sim.rounds, VirtualRounds)
    rounds, ids = sim.rounds.rounds, np.arange(10)
    times = client_times(rounds.devices, rounds.work, ids, step_s=0.05)
    per_step = rounds.devices.slowdown * 0.05
    fixed = times.download_s + times.upload_s + (rounds.work.steps - rounds.work.budgeted_of(ids)) * per_step
    middle = int(np.argsort(rounds.devices.slowdown)[5])  # a step and a half of its global model past its fixed work
    deadline = float(fixed[middle] + 1.5 * per_step[middle])
    overrides = {**spread, "system.deadline_s": deadline, "system.late_work": "partial", "train.rounds": 4}
    # Execute
    Simulation(RunConfig().override(tiny_overrides(tmp_path / "run", **overrides))).run()
    # Assert: a late client is partial exactly when it fits a step of the global model, and then moves it
    missed = _trained(tmp_path / "run", 4) + [
        c
        for t in range(4)
        for c in pq.read_table(tmp_path / "run" / "clients" / f"round_{t:06d}.parquet").to_pylist()
        if c["status"] == "late"
    ]
    missed = [c for c in missed if c["status"] != "finished"]
    fits = {c["client_id"]: fixed[c["client_id"]] + per_step[c["client_id"]] <= deadline for c in missed}
    assert any(fits.values()) and not all(fits.values())
    for c in missed:
        assert (c["status"] == "partial") == fits[c["client_id"]]
        if c["status"] == "partial":
            assert c["update_norm"] > 0 and c["trained_steps"] > rounds.work.steps[c["client_id"]] // 2


def test_a_round_whose_clients_stepped_only_in_unreported_phases_does_not_warn_of_no_step(caplog) -> None:
    # Prepare: Ditto-like clients whose reported phase took no step but whose personal phase did
    reports = [
        ClientReport(c, 10, math.nan, steps=0, update_norm=0.0, bytes_up=0, bytes_down=0, seconds=0.0, trained_steps=3)
        for c in range(2)
    ]
    # Execute
    with caplog.at_level(logging.WARNING, logger="rayfed.engine.metrics"):
        summarise_round(0, reports, [], {}, {})
    # Assert
    assert "took a local step" not in caplog.text


VARYING = {
    "ktpfl": {"algorithm.params": {"public_size": 60, "max_local_epochs": 3}},
    "fedclassavg": {
        "model.client_models": ["fca_alexnet"],
        "algorithm.params": {"warmup": True},
        "data.options": {"num_samples": 200},
        "data.num_clients": 4,
        "train.batch_size": 16,
    },
    "fedfomo": {"algorithm.params": {"num_models": 2}},
    "apple": {},
    "fedproto": {},
}
"""Methods whose work changes by round: KT-pFL's distillation (from round 1) and its ramp of local epochs, and its
download of targets; FedClassAvg's warm-up in each client's first round; FedFomo's download of the models it
chooses among those uploaded so far; APPLE's download of the cores newer than the client's copies; FedProto's
download of the prototypes uploaded so far (none in the first round)."""


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(VARYING))
def test_a_method_whose_work_changes_by_round_is_charged_each_rounds_own(tmp_path, method) -> None:
    # Execute: three rounds, half the clients a round (some train for the first time in a later round)
    overrides = {**EQUAL, "algorithm.name": method, "train.rounds": 3, **VARYING[method]}
    sim = Simulation(RunConfig().override(tiny_overrides(tmp_path, **overrides)))
    sim.run()
    # Assert: in every round, every counted client was charged the steps it took and the bytes it moved
    assert isinstance(sim.rounds, VirtualRounds)
    clients = _trained(tmp_path, 3)
    assert len(clients) == 3 * sim.rounds.rounds.wanted
    for c in clients:
        assert c["charged_steps"] == c["trained_steps"] > 0
        assert (c["charged_bytes_down"], c["charged_bytes_up"]) == (c["bytes_down"], c["bytes_up"])
    # ... where the first round's work, charged every round, would not have been
    ids = np.array([c["client_id"] for c in clients])
    steps, down, _ = sim.rounds.rounds.work.of(ids)
    done = np.array([(c["trained_steps"], c["bytes_down"]) for c in clients])
    assert ((done[:, 0] != steps) | (done[:, 1] != down)).any()


@pytest.mark.slow
def test_a_method_whose_work_changes_undeclared_is_warned_of_once(tmp_path, monkeypatch, caplog) -> None:
    # Prepare: FedProto as if it did not declare that its download changes by round (none in its first round)
    monkeypatch.setattr("rayfed.scheduling.workload.varies_work", lambda client: False)
    overrides = tiny_overrides(tmp_path, **EQUAL, **{"algorithm.name": "fedproto", "train.rounds": 3})
    # Execute
    with caplog.at_level(logging.WARNING, logger="rayfed.scheduling.sync_rounds"):
        Simulation(RunConfig().override(overrides)).run()
    # Assert: the first round is charged right, the second not, and the run says so once, naming the fix
    warned = [r.getMessage() for r in caplog.records if "virtual clock charged" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("round 1:") and "VaryingWork" in warned[0]
    assert "bytes down" in warned[0]
