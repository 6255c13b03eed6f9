"""The asynchronous schedule: arrivals in virtual-time order, K per server step, staleness, launches grouped by
model version, and a resumed schedule that repeats the same events."""

from __future__ import annotations

import numpy as np
import pytest

from rayfed.system import (
    AsyncSchedule,
    AsyncState,
    Availability,
    ClientStatus,
    DeviceProfiles,
    ServerStep,
    SystemConfig,
    VersionPlan,
    Workload,
    load_profiles,
)
from rayfed.util.errors import ConfigError
from rayfed.util.files import load_arrays, save_arrays

M = 300


def _work() -> Workload:
    return Workload(np.full(M, 20, dtype=np.int64), bytes_down=4e5, bytes_up=4e5)


def _equal(num_clients: int = M, availability: Availability | None = None) -> DeviceProfiles:
    """Devices that each take 2.8 s a round of :func:`_work`: 0.16 s down, 2 s of training, 0.64 s up."""
    return DeviceProfiles(
        np.ones(num_clients),
        np.full(num_clients, 2.5e6),
        np.full(num_clients, 6.25e5),
        availability or Availability.everyone(num_clients),
    )


def _on_equal_devices(
    concurrency: int, buffer_size: int, last_version: int, availability: Availability | None = None
) -> AsyncSchedule:
    devices = _equal(availability=availability)
    return AsyncSchedule(
        SystemConfig(devices="equal"),
        devices,
        _work(),
        0,
        concurrency=concurrency,
        buffer_size=buffer_size,
        last_version=last_version,
    )


def _plans(schedule: AsyncSchedule, versions: range) -> list[VersionPlan]:
    return [schedule.plan(v) for v in versions]


def test_equal_devices_give_the_schedule_worked_out_by_hand() -> None:
    first, second, third = _plans(_on_equal_devices(4, 2, 10), range(3))
    # 4 clients start at 0 and all report at 2.8 s: the server takes both its steps of that instant before the
    # freed slots are filled, so all 4 replacements start from version 2 and none from version 1
    assert len(first.launched) == 4 and first.arrives_at.tolist() == [1, 1, 2, 2]
    assert (first.step.time_s, first.step.staleness.tolist()) == (pytest.approx(2.8), [0, 0])
    assert (second.step.time_s, second.step.staleness.tolist()) == (pytest.approx(2.8), [1, 1])
    assert len(second.launched) == 0
    assert len(third.launched) == 4 and third.arrives_at.tolist() == [3, 3, 4, 4]
    assert (third.step.time_s, third.step.staleness.tolist()) == (pytest.approx(5.6), [0, 0])
    assert len(set(first.launched.tolist()) | set(third.launched.tolist())) == 8  # an idle client is drawn


def test_with_concurrency_equal_to_the_buffer_every_step_is_synchronous() -> None:
    # C = K on equal devices: every instant's K arrivals make one step, and every client starts from it
    plans = _plans(_on_equal_devices(5, 5, 20), range(20))
    assert all(len(plan.launched) == 5 and plan.arrives_at.tolist() == [plan.version + 1] * 5 for plan in plans)
    assert all(plan.step.staleness.tolist() == [0] * 5 for plan in plans)
    assert [plan.step.time_s for plan in plans] == pytest.approx([2.8 * (v + 1) for v in range(20)])


def _heterogeneous(**fields: object) -> tuple[SystemConfig, DeviceProfiles]:
    config = SystemConfig(devices="lognormal", compute_spread=1.0, availability="diurnal", **fields)  # type: ignore
    devices = load_profiles(config, M)
    assert devices is not None
    return config, devices


def test_every_step_applies_k_updates_in_time_order_with_their_staleness() -> None:
    config, devices = _heterogeneous(dropout=0.1)
    schedule = AsyncSchedule(config, devices, _work(), 7, concurrency=40, buffer_size=8, last_version=60)
    plans = _plans(schedule, range(60))
    launch_version = {int(i): plan.version for plan in plans for i in plan.step.launched_index}
    steps: dict[int, ServerStep] = {plan.step.version: plan.step for plan in plans}
    times = [steps[v].time_s for v in sorted(steps)]
    assert times == sorted(times) and times[0] > 0
    lost = 0
    for version, step in steps.items():
        assert len(step.arrived) == 8 and len(step.state.client_id) <= 40
        for index, staleness in zip(step.arrived_launch.tolist(), step.staleness.tolist(), strict=True):
            if index in launch_version:  # launched within the plans read
                assert staleness == version - 1 - launch_version[index] >= 0
        assert set(step.lost_status.tolist()) <= {ClientStatus.DROPPED, ClientStatus.OFFLINE}
        lost += len(step.lost)
        # a loss reaches the server within the lost client's round, after the step before and by this one: when it
        # dropped out, or when its online window closed
        began, ended, ids = step.lost_start_s, step.lost_s, step.lost
        assert ((began <= ended) & (ended < began + schedule.round_s[ids]) & (ended <= step.time_s)).all()
        if version > 1:
            assert (ended >= steps[version - 1].time_s).all()
        offline = step.lost_status == ClientStatus.OFFLINE
        windows_end = [devices.availability.online_until(np.array([c]), s)[0] for c, s in zip(ids, began, strict=True)]
        assert (ended[offline] == np.array(windows_end)[offline]).all()
    assert lost > 0
    for plan in plans:  # each launched client's update arrives in the step the plan says, or never
        for index, arrives in zip(plan.step.launched_index.tolist(), plan.arrives_at.tolist(), strict=True):
            assert arrives == -1 or (plan.version < arrives <= 60 and index in steps[arrives].arrived_launch)
        assert plan.to_train.tolist() == plan.launched[plan.arrives_at >= 0].tolist()
    assert max(s for step in steps.values() for s in step.staleness) > 1  # slow devices report late


def test_only_online_clients_are_launched() -> None:
    # clients 0-149 are online 10 s of every 100 s, the others never
    clients = np.arange(150)
    online = Availability.from_windows(clients, np.zeros(150), np.full(150, 10.0), np.full(M, 100.0), M, "t")
    plans = _plans(_on_equal_devices(20, 5, 30, online), range(30))
    assert all((plan.launched < 150).all() for plan in plans)
    # launched at 0-7.2 s a client finishes in its window; later ones go offline at 10 s, and slots wait for 100 s
    statuses = {int(s) for plan in plans for s in plan.step.lost_status}
    assert statuses == {ClientStatus.OFFLINE} and plans[-1].step.time_s > 100


def test_a_schedule_resumed_from_a_saved_state_repeats_the_same_events(tmp_path) -> None:
    config, devices = _heterogeneous(dropout=0.05)
    kwargs = {"concurrency": 30, "buffer_size": 5, "last_version": 40}
    whole = _plans(AsyncSchedule(config, devices, _work(), 3, **kwargs), range(40))  # type: ignore[arg-type]
    save_arrays(tmp_path / "state.npz", whole[11].step.state.to_arrays())  # a checkpoint after version 12
    state = AsyncState.from_arrays(load_arrays(tmp_path / "state.npz"))
    resumed = _plans(AsyncSchedule(config, devices, _work(), 3, state=state, **kwargs), range(12, 40))  # type: ignore
    for before, after in zip(whole[12:], resumed, strict=True):
        assert np.array_equal(before.launched, after.launched) and np.array_equal(before.arrives_at, after.arrives_at)
        assert before.step.time_s == after.step.time_s
        assert np.array_equal(before.step.arrived, after.step.arrived)
        assert np.array_equal(before.step.staleness, after.step.staleness)


def test_fedasync_applies_each_update_as_it_arrives() -> None:
    config, devices = _heterogeneous()
    schedule = AsyncSchedule(config, devices, _work(), 0, concurrency=10, buffer_size=1, last_version=20)
    plans = _plans(schedule, range(20))
    assert all(len(plan.step.arrived) == 1 for plan in plans)
    assert [plan.step.version for plan in plans] == list(range(1, 21))


@pytest.mark.parametrize(
    ("concurrency", "buffer_size", "message"),
    [
        (
            10,
            20,
            "algorithm.params.buffer_size=20 is larger than algorithm.params.concurrency=10: the server would wait "
            "for more updates than clients train at once; set algorithm.params.buffer_size to at most 10, or raise "
            "algorithm.params.concurrency",
        ),
        (
            400,
            10,
            "algorithm.params.concurrency must be an integer in [1, 300], but got algorithm.params.concurrency=400",
        ),
        (10, 0, "algorithm.params.buffer_size must be an integer >= 1, but got algorithm.params.buffer_size=0"),
    ],
)
def test_bad_concurrency_and_buffers_are_refused(concurrency: int, buffer_size: int, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        _on_equal_devices(concurrency, buffer_size, 5)
    assert str(raised.value) == message


def test_more_concurrency_than_clients_ever_online_is_refused() -> None:
    online = Availability.from_windows(np.arange(5), np.zeros(5), np.ones(5), np.full(M, 10.0), M, "t")
    with pytest.raises(ConfigError, match=r"concurrency=6 is more than the 5 clients that are ever online"):
        _on_equal_devices(6, 2, 5, online)


def test_a_schedule_that_loses_every_launch_stops_with_its_reason(monkeypatch) -> None:
    # clients can report in principle (always online), but all but one in a million drop out: the step would take
    # a million launches, and past the bound the schedule stops, saying why, instead of looking hung
    monkeypatch.setattr("rayfed.system.schedule._STALLED", 500)
    devices = _equal()
    schedule = AsyncSchedule(
        SystemConfig(devices="equal", dropout=0.999999),
        devices,
        _work(),
        0,
        concurrency=4,
        buffer_size=2,
        last_version=5,
    )
    with pytest.raises(ConfigError, match=r"^the asynchronous schedule stopped at virtual time .* 500 launches since"):
        schedule.plan(0)


def test_a_schedule_whose_clients_are_never_online_long_enough_is_refused() -> None:
    # every client online 1 s of every 100 s, and each round takes 2.8 s
    online = Availability.from_windows(np.arange(M), np.zeros(M), np.ones(M), np.full(M, 100.0), M, "t")
    with pytest.raises(
        ConfigError, match=r"could never make a step .* at most 1 s at a time, but its round takes 2.8 s"
    ):
        _on_equal_devices(4, 2, 5, online)
