"""Traces read from files: FedScale's two pickled formats as plain data only, and plain tables per client."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayfed.system import SystemConfig, load_profiles
from rayfed.system.traces import read_plain_pickle
from rayfed.util.errors import ConfigError


def _pickle(path: Path, data: object) -> str:
    path.write_bytes(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
    return str(path)


def _fedscale_capacity(tmp_path: Path, num_clients: int) -> str:
    """FedScale's device capacity format, keyed from 1 as its file is (client c has computation 10 (c + 1))."""
    data = {key: {"computation": 10.0 * key, "communication": 800.0 * key} for key in range(1, num_clients + 1)}
    return _pickle(tmp_path / "client_device_capacity", data)


def _fedscale_behaviour(tmp_path: Path) -> str:
    """FedScale's client behaviour format: two clients, one online twice a 100 s period, one 60 s of 200 s."""
    data = {
        1: {"duration": 100, "inactive": [20, 90], "finish_time": 100, "active": [0, 50], "model": "phone A"},
        2: {"duration": 200, "inactive": [160], "finish_time": 200, "active": [100], "model": "phone B"},
        3: {"duration": 10, "inactive": [5], "finish_time": 10, "active": [0], "model": "phone C"},
    }
    return _pickle(tmp_path / "client_behave_trace", data)


def test_a_fedscale_capacity_trace_loads_as_documented(tmp_path) -> None:
    path = _fedscale_capacity(tmp_path, 5)
    devices = load_profiles(SystemConfig(devices="trace", device_trace=path), 4)
    assert devices is not None
    # computation over the trace's median (30 ms: client key 3), the first 4 keys in order
    assert devices.slowdown.tolist() == [10 / 30, 20 / 30, 30 / 30, 40 / 30]
    # communication is kbit/s, both ways: 800 kbit/s = 100,000 bytes/s
    assert devices.download_bps.tolist() == [1e5, 2e5, 3e5, 4e5] and devices.upload_bps.tolist() == [1e5, 2e5, 3e5, 4e5]


def test_a_fedscale_behaviour_trace_loads_as_documented(tmp_path) -> None:
    config = SystemConfig(devices="equal", availability="trace", availability_trace=_fedscale_behaviour(tmp_path))
    devices = load_profiles(config, 2)
    assert devices is not None
    online = devices.availability
    assert online.online(np.array([0, 0, 0, 1, 1]), np.array([10.0, 30.0, 160.0, 150.0, 170.0])).tolist() == [
        True,
        False,
        True,  # 160 = 60 into client 0's second period, in [50, 90)
        True,
        False,
    ]
    assert online.next_online(np.array([0, 1]), 25.0).tolist() == [50.0, 100.0]
    assert online.online_until(np.array([0]), 60.0).tolist() == [90.0]


def test_a_pickle_that_is_not_plain_data_is_refused_and_never_runs(tmp_path) -> None:
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    path = _pickle(tmp_path / "evil.pkl", {1: {"computation": Payload(), "communication": 1.0}})
    with pytest.raises(ConfigError) as raised:
        load_profiles(SystemConfig(devices="trace", device_trace=path), 1)
    message = str(raised.value)
    assert message.startswith(f"system.device_trace={path!r} is refused: it holds a pickled pathlib")
    assert "never runs what a pickle names" in message and "\n" not in message
    assert not marker.exists()


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (np.arange(3.0), "it holds a pickled numpy"),
        ({1: (1.0, 2.0)}, "it holds a tuple, not plain data"),
        ({1: {"computation": None}}, "it holds a NoneType, not plain data"),
        ({1: {1, 2}}, "it holds a set, not plain data"),
    ],
)
def test_other_objects_are_refused_in_one_line(tmp_path, data, fragment) -> None:
    path = _pickle(tmp_path / "trace.pkl", data)
    with pytest.raises(ConfigError, match=fragment) as raised:
        read_plain_pickle(path, "system.device_trace")
    assert "\n" not in str(raised.value)


def test_a_file_that_is_not_a_pickle_is_refused_by_its_first_bytes(tmp_path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text("client,computation\n1,2\n")
    with pytest.raises(ConfigError) as raised:
        read_plain_pickle(str(path), "system.device_trace")
    assert str(raised.value) == (
        f"system.device_trace={str(path)!r} is not a pickle (it starts with b'client,compu', where FedScale's pickled "
        "traces, protocol 2 or later, start with b'\\x80'): name a table .csv or .parquet, or give FedScale's "
        "pickled file (docs/system.md)"
    )


def test_a_pickle_that_holds_itself_or_shares_a_list_many_times_is_checked_in_one_pass(tmp_path) -> None:
    # a list that holds itself, and 2**80 paths through 80 shared lists: the check looks into each list once
    looped: list = []
    looped.append(looped)
    shared: list = []
    for _ in range(80):
        shared = [shared, shared]
    assert list(read_plain_pickle(_pickle(tmp_path / "shared", {1: shared}), "system.device_trace")) == [1]
    with pytest.raises(ConfigError, match=r"client 0's 'computation' is \[\[...\]\]; it must be a finite number"):
        load_profiles(
            SystemConfig(devices="trace", device_trace=_pickle(tmp_path / "looped", {1: {"computation": looped}})), 1
        )


def test_a_trace_missing_clients_is_refused(tmp_path) -> None:
    path = _fedscale_capacity(tmp_path, 3)
    with pytest.raises(ConfigError) as raised:
        load_profiles(SystemConfig(devices="trace", device_trace=path), 10)
    assert str(raised.value) == (
        f"system.device_trace={path!r} holds 3 clients, but the run has 10 (data.num_clients): a trace gives every "
        "client its own entry; use a trace with as many clients, or fewer clients"
    )


def test_a_negative_speed_in_a_trace_is_refused(tmp_path) -> None:
    path = _pickle(tmp_path / "trace", {1: {"computation": 5.0, "communication": 1.0}, 2: {"computation": -5.0}})
    with pytest.raises(ConfigError, match=r"client 1's 'computation' is -5.0; it must be a finite number > 0"):
        load_profiles(SystemConfig(devices="trace", device_trace=path), 2)


def test_a_device_table_loads_in_client_order(tmp_path) -> None:
    path = tmp_path / "devices.csv"
    path.write_text("client_id,slowdown,download_mbps,upload_mbps\n1,2.0,8,4\n0,0.5,16,8\n2,1.0,8,8\n")
    devices = load_profiles(SystemConfig(devices="trace", device_trace=str(path)), 2)
    assert devices is not None
    assert devices.slowdown.tolist() == [0.5, 2.0]
    assert devices.download_bps.tolist() == [2e6, 1e6] and devices.upload_bps.tolist() == [1e6, 5e5]


def test_a_device_table_missing_clients_names_them(tmp_path) -> None:
    path = tmp_path / "devices.csv"
    path.write_text("client_id,slowdown,download_mbps,upload_mbps\n0,1,1,1\n3,1,1,1\n")
    with pytest.raises(ConfigError) as raised:
        load_profiles(SystemConfig(devices="trace", device_trace=str(path)), 4)
    assert str(raised.value) == (
        f"system.device_trace={str(path)!r} has no row for 2 of the run's 4 clients (client_id 1, 2); give every "
        "client_id from 0 to 3 a row"
    )


@pytest.mark.parametrize(
    ("rows", "fragment"),
    [
        ("0,-1,1,1\n1,1,1,1\n", "client 0's slowdown is -1.0; it must be a finite number > 0"),
        ("0,1,1,1\n0,1,1,1\n1,1,1,1\n", "client_id 0 has more than one row"),
    ],
)
def test_bad_device_tables_are_refused(tmp_path, rows, fragment) -> None:
    path = tmp_path / "devices.csv"
    path.write_text("client_id,slowdown,download_mbps,upload_mbps\n" + rows)
    with pytest.raises(ConfigError, match=fragment):
        load_profiles(SystemConfig(devices="trace", device_trace=str(path)), 2)


def test_a_table_without_a_column_names_it(tmp_path) -> None:
    path = tmp_path / "devices.csv"
    path.write_text("client_id,slowdown,download_mbps\n0,1,1\n")
    with pytest.raises(ConfigError, match=r"has no column 'upload_mbps'; its columns are client_id, slowdown, down"):
        load_profiles(SystemConfig(devices="trace", device_trace=str(path)), 1)


def test_an_availability_table_in_parquet_loads(tmp_path) -> None:
    path = tmp_path / "online.parquet"
    table = {"client_id": [0, 0, 1], "start_s": [0.0, 30.0, 5.0], "end_s": [10.0, 40.0, 6.0], "period_s": [60.0] * 3}
    pq.write_table(pa.table(table), path)
    config = SystemConfig(devices="equal", availability="trace", availability_trace=str(path))
    devices = load_profiles(config, 2)
    assert devices is not None
    assert devices.availability.online(np.array([0, 0, 1, 1]), np.array([95.0, 75.0, 5.5, 7.0])).tolist() == [
        True,
        False,
        True,
        False,
    ]


def test_an_availability_table_with_two_periods_for_a_client_is_refused(tmp_path) -> None:
    path = tmp_path / "online.csv"
    path.write_text("client_id,start_s,end_s,period_s\n0,0,1,10\n0,2,3,20\n")
    config = SystemConfig(devices="equal", availability="trace", availability_trace=str(path))
    with pytest.raises(ConfigError, match=r"client 0's rows give different period_s; give one per client"):
        load_profiles(config, 1)


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"active": [0, 50], "inactive": [20], "finish_time": 100}, r"an end for every start"),
        ({"active": ["0"], "inactive": [20], "finish_time": 100}, r"must be lists of numbers"),
        ({"active": [0], "inactive": [20], "finish_time": 0}, r"client 0's 'finish_time' is 0; it must be a finite"),
    ],
)
def test_bad_behaviour_entries_are_refused(tmp_path, entry, fragment) -> None:
    path = _pickle(tmp_path / "behaviour", {1: entry})
    config = SystemConfig(devices="equal", availability="trace", availability_trace=path)
    with pytest.raises(ConfigError, match=fragment):
        load_profiles(config, 1)


def test_an_end_past_the_last_start_is_unused_as_fedscale_reads_it(tmp_path) -> None:
    path = _pickle(tmp_path / "behaviour", {1: {"active": [10], "inactive": [20, 90], "finish_time": 100}})
    devices = load_profiles(SystemConfig(devices="equal", availability="trace", availability_trace=path), 1)
    assert devices is not None
    assert (devices.availability.starts.tolist(), devices.availability.ends.tolist()) == ([10.0], [20.0])
