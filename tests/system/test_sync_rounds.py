"""Synchronous rounds in virtual time: sampling among the clients online, deadlines, over-commitment, dropouts."""

from __future__ import annotations

import numpy as np
import pytest

from rayfed.system import (
    Availability,
    ClientStatus,
    DeviceProfiles,
    SyncRounds,
    SystemConfig,
    Workload,
    client_times,
    load_profiles,
)
from rayfed.util.errors import ConfigError
from rayfed.util.seeding import sample_clients

M = 200


def _work(steps: int = 20) -> Workload:
    return Workload(np.full(M, steps, dtype=np.int64), bytes_down=4e5, bytes_up=4e5)


def _devices(slowdown: np.ndarray | None = None, availability: Availability | None = None) -> DeviceProfiles:
    return DeviceProfiles(
        np.linspace(0.5, 4.0, M) if slowdown is None else slowdown,
        np.full(M, 2.5e6),
        np.full(M, 6.25e5),
        availability or Availability.everyone(M),
    )


def _lognormal(**fields: object) -> tuple[SystemConfig, DeviceProfiles]:
    config = SystemConfig(devices="lognormal", compute_spread=1.0, **fields)  # type: ignore[arg-type]
    devices = load_profiles(config, M)
    assert devices is not None
    return config, devices


def test_equal_devices_always_online_sample_and_count_as_without_a_system_model() -> None:
    config = SystemConfig(devices="equal")
    devices = load_profiles(config, M)
    assert devices is not None
    rounds, now = SyncRounds(config, devices, _work(), seed=3, join_ratio=0.1), 0.0
    for t in range(5):
        outcome = rounds.round(t, now)
        assert outcome.client_ids.tolist() == sample_clients(3, t, M, 0.1).tolist()
        assert outcome.counted_ids.tolist() == outcome.client_ids.tolist()
        assert (outcome.status == ClientStatus.FINISHED).all() and (outcome.steps == 20).all()
        # every device alike: 0.16 s down, 20 x 0.1 s of training, 0.64 s up
        assert outcome.start_s == now and outcome.duration_s == pytest.approx(2.8)
        now = outcome.end_s


def test_over_commitment_keeps_the_first_finishers() -> None:
    config = SystemConfig(devices="equal", over_commit=1.5)
    rounds = SyncRounds(config, _devices(), _work(), seed=0, join_ratio=0.1)
    outcome = rounds.round(0, 100.0)
    assert len(outcome.client_ids) == 30 and len(outcome.counted_ids) == 20
    kept, surplus = outcome.status == ClientStatus.FINISHED, outcome.status == ClientStatus.SURPLUS
    assert surplus.sum() == 10 and outcome.finish_s[kept].max() <= outcome.finish_s[surplus].min()
    assert outcome.end_s == outcome.finish_s[kept].max()  # the round ends with its 20th client
    assert (outcome.steps[surplus] == 0).all()


def test_a_deadline_drops_late_clients_work() -> None:
    config, devices = _lognormal(deadline_s=4.0)
    rounds = SyncRounds(config, devices, _work(), seed=0, join_ratio=0.25)
    outcome = rounds.round(0, 0.0)
    late = outcome.status == ClientStatus.LATE
    assert 0 < late.sum() < len(outcome.client_ids)
    assert (outcome.finish_s[late] > 4.0).all() and (outcome.finish_s[~late] <= 4.0).all()
    assert (outcome.steps[late] == 0).all() and outcome.end_s == 4.0  # fewer than wanted: it waits for the deadline


def test_partial_work_counts_the_steps_done_by_the_deadline() -> None:
    config, devices = _lognormal(deadline_s=4.0, late_work="partial")
    rounds = SyncRounds(config, devices, _work(), seed=0, join_ratio=0.25)
    outcome = rounds.round(0, 0.0)
    partial = outcome.status == ClientStatus.PARTIAL
    assert partial.any() and len(outcome.counted_ids) <= 50
    assert ((outcome.steps[partial] > 0) & (outcome.steps[partial] < 20)).all()
    assert (outcome.finish_s[partial] == 4.0).all()
    times = client_times(devices, _work(), outcome.client_ids[partial], step_s=config.step_s)
    used = times.download_s + outcome.steps[partial] * devices.slowdown[outcome.client_ids[partial]] * 0.1
    assert (used + times.upload_s <= 4.0 + 1e-9).all()  # the steps counted fit before the upload


def test_dropouts_lose_their_work() -> None:
    config = SystemConfig(devices="equal", dropout=0.3)
    rounds = SyncRounds(config, _devices(), _work(), seed=0, join_ratio=1.0)
    outcome = rounds.round(0, 0.0)
    dropped = outcome.status == ClientStatus.DROPPED
    assert 40 < dropped.sum() < 80  # about 30 % of 200
    assert np.isinf(outcome.finish_s[dropped]).all() and (outcome.steps[dropped] == 0).all()
    assert not np.isin(outcome.client_ids[dropped], outcome.counted_ids).any()


def test_only_online_clients_are_sampled_and_a_round_waits_for_one() -> None:
    # clients 0-99 online in [100, 200) of every 1000 s, clients 100-199 in [500, 600)
    clients = np.arange(M)
    starts = np.where(clients < 100, 100.0, 500.0)
    online = Availability.from_windows(clients, starts, starts + 100, np.full(M, 1000.0), M, "test")
    rounds = SyncRounds(SystemConfig(devices="equal"), _devices(availability=online), _work(), seed=0, join_ratio=0.1)
    first = rounds.round(0, 0.0)
    assert first.start_s == 100.0 and (first.client_ids < 100).all() and len(first.client_ids) == 20
    second = rounds.round(1, 520.0)
    assert second.start_s == 520.0 and (second.client_ids >= 100).all()


def test_a_client_that_goes_offline_before_it_finishes_loses_its_work() -> None:
    online = Availability.from_windows(
        np.arange(M), np.zeros(M), np.where(np.arange(M) == 0, 1.0, 1000.0), np.full(M, 1000.0), M, "test"
    )
    rounds = SyncRounds(SystemConfig(devices="equal"), _devices(availability=online), _work(), seed=0, join_ratio=1.0)
    outcome = rounds.round(0, 0.0)
    assert outcome.status[0] == ClientStatus.OFFLINE and np.isinf(outcome.finish_s[0])
    assert (outcome.status[1:] == ClientStatus.FINISHED).all()


def test_partial_work_spends_the_budget_on_the_covered_steps_and_leaves_late_who_would_train_none() -> None:
    # Prepare: 20 steps of which 10 (a phase outside the budget, a head) train whole before the budgeted 10
    config, devices = _lognormal(deadline_s=4.0, late_work="partial")
    work = Workload(np.full(M, 20, dtype=np.int64), 4e5, 4e5, budgeted=np.full(M, 10, dtype=np.int64))
    outcome = SyncRounds(config, devices, work, seed=0, join_ratio=0.25).round(0, 0.0)
    everything = SyncRounds(config, devices, _work(), seed=0, join_ratio=0.25).round(0, 0.0)
    # Assert: a partial client takes its 10 fixed steps and a budget of the covered ones that fits by the deadline
    partial = outcome.status == ClientStatus.PARTIAL
    ids = outcome.client_ids[partial]
    assert partial.any() and ((outcome.budget[partial] > 0) & (outcome.budget[partial] < 10)).all()
    assert (outcome.steps[partial] == 10 + outcome.budget[partial]).all()
    assert (outcome.budget[~partial] == -1).all()
    times = client_times(devices, work, ids, step_s=config.step_s)
    used = times.download_s + outcome.steps[partial] * devices.slowdown[ids] * 0.1 + times.upload_s
    assert (used <= 4.0 + 1e-9).all()
    # those that fit a step of the budget-free work but none of the covered steps stay late
    was_partial = everything.client_ids[everything.status == ClientStatus.PARTIAL]
    assert len(ids) < len(was_partial) and set(ids) <= set(was_partial)


def test_a_deadline_no_device_can_meet_is_refused() -> None:
    config = SystemConfig(devices="equal", deadline_s=1.0)
    with pytest.raises(ConfigError) as raised:
        SyncRounds(config, _devices(), _work(), seed=0, join_ratio=0.1)
    assert str(raised.value) == (
        "system.deadline_s=1 is shorter than any device's round: the fastest, client 0's, takes 1.8 s (download "
        "0.16 s, training 1 s, upload 0.64 s); raise system.deadline_s, or lower the work (train.local_epochs) or "
        "system.step_s"
    )
    # counting partial work, one step is enough: 0.16 + 0.05 + 0.64 s fits
    SyncRounds(SystemConfig(devices="equal", deadline_s=1.0, late_work="partial"), _devices(), _work(), 0, 0.1)


def test_virtual_time_increases_and_a_round_is_a_function_of_its_start() -> None:
    config, devices = _lognormal(availability="diurnal", deadline_s=5.0, over_commit=1.3, dropout=0.1)
    rounds, now, outcomes = SyncRounds(config, devices, _work(), seed=1, join_ratio=0.2), 0.0, []
    for t in range(20):
        outcomes.append(rounds.round(t, now))
        assert outcomes[-1].end_s > now
        now = outcomes[-1].end_s
    again = SyncRounds(config, devices, _work(), seed=1, join_ratio=0.2).round(12, outcomes[11].end_s)
    assert again.client_ids.tolist() == outcomes[12].client_ids.tolist()
    assert np.array_equal(again.finish_s, outcomes[12].finish_s) and np.array_equal(again.status, outcomes[12].status)
    statuses = np.concatenate([o.status for o in outcomes])
    assert {ClientStatus.FINISHED, ClientStatus.LATE, ClientStatus.DROPPED} <= set(statuses.tolist())
