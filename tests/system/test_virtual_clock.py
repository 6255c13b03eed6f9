"""The virtual clock's equations on small arrays: a client's time (Eq. 1) and its partial work (Eq. 2)."""

from __future__ import annotations

import numpy as np
import pytest

from rayfed.system import Availability, DeviceProfiles, Workload, client_times, steps_within


def _devices() -> DeviceProfiles:
    """Three devices: the reference one, one 3x slower with half the bandwidth, one 2x faster."""
    return DeviceProfiles(
        slowdown=np.array([1.0, 3.0, 0.5]),
        download_bps=np.array([1e6, 5e5, 1e6]),
        upload_bps=np.array([2.5e5, 1.25e5, 2.5e5]),
        availability=Availability.everyone(3),
    )


def test_a_clients_time_is_download_plus_steps_times_slowdown_plus_upload() -> None:
    work = Workload(steps=np.array([10, 10, 40]), bytes_down=1e6, bytes_up=np.array([5e5, 5e5, 2.5e5]))
    times = client_times(_devices(), work, np.array([2, 0, 1]), step_s=0.2)
    assert times.download_s.tolist() == [1.0, 1.0, 2.0]
    assert times.train_s.tolist() == pytest.approx([4.0, 2.0, 6.0])
    assert times.upload_s.tolist() == [1.0, 2.0, 4.0]
    assert times.total_s.tolist() == pytest.approx([6.0, 5.0, 12.0])


def test_partial_work_is_the_steps_that_fit_before_the_upload() -> None:
    work = Workload(steps=np.array([10, 10, 40]), bytes_down=1e6, bytes_up=5e5)
    ids = np.array([0, 1, 2])
    times = client_times(_devices(), work, ids, step_s=0.2)
    per_step = _devices().slowdown * 0.2
    # room for training: 6 - 1 - 2 = 3 s (15 steps, all 10), 6 - 2 - 4 = 0 s (none), 6 - 1 - 2 = 3 s (30 of 40)
    assert steps_within(times, work.steps, 6.0, per_step).tolist() == [10, 0, 30]
    assert steps_within(times, work.steps, 1.0, per_step).tolist() == [0, 0, 0]  # not even the transfers fit


def test_partial_work_trains_the_phases_outside_the_budget_first() -> None:
    # Prepare: 10, 10 and 40 steps, of which 5, 5 and 20 are outside the step budget and train whole
    work = Workload(steps=np.array([10, 10, 40]), bytes_down=1e6, bytes_up=5e5, budgeted=np.array([5, 5, 20]))
    ids = np.array([0, 1, 2])
    times = client_times(_devices(), work, ids, step_s=0.2)
    per_step = _devices().slowdown * 0.2
    fixed = work.steps - work.budgeted_of(ids)
    # Execute / Assert: room of 3 s, 0 s and 3 s (Eq. 2), less the steps outside the budget (5 x 0.2 s, 5 x 0.6 s,
    # 20 x 0.1 s): 2 s (all 5 budgeted steps), none, 1 s (10 of 20)
    assert steps_within(times, work.budgeted_of(ids), 6.0, per_step, fixed=fixed).tolist() == [5, 0, 10]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"steps": np.array([-1]), "bytes_down": 1.0, "bytes_up": 1.0}, "Workload.steps holds one count >= 0"),
        ({"steps": np.array([1, 2]), "bytes_down": np.ones(3), "bytes_up": 1.0}, "Workload.bytes_down is one"),
        ({"steps": np.array([1]), "bytes_down": 1.0, "bytes_up": -1.0}, "Workload.bytes_up is one"),
        ({"steps": np.array([1]), "bytes_down": 1.0, "bytes_up": 1.0, "budgeted": np.array([2])}, "from 0 to its"),
    ],
)
def test_a_workload_holds_one_entry_per_client(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        Workload(**fields)
