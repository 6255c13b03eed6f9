"""The client state store: in memory up to its budget, the least recently used states spilled to disk."""

from __future__ import annotations

import numpy as np

from rayfed.engine.state_store import ClientStateStore


def _state(cid: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(cid)
    return {"model": rng.normal(size=8).astype(np.float32), "steps": np.array([cid], np.int64)}


def test_states_beyond_the_budget_spill_to_disk_and_come_back_identical(tmp_path) -> None:
    # Prepare: each state is 40 bytes; the budget holds two.
    store = ClientStateStore(tmp_path / "spill", memory_bytes=80)
    # Execute
    for cid in range(5):
        store.put(cid, _state(cid))
    # Assert: the three least recently used are on disk, one file each, and none is lost.
    assert store.spilled_ids() == [0, 1, 2] and store.bytes_in_memory <= 80
    assert sorted(p.name for p in (tmp_path / "spill").iterdir()) == [f"client_{c:07d}.npz" for c in (0, 1, 2)]
    assert len(store) == 5 and list(store.ids()) == [0, 1, 2, 3, 4] and 0 in store
    for cid, state in store.get_many([0, 1, 2, 3, 4]).items():
        assert state.keys() == _state(cid).keys()
        for name, value in _state(cid).items():
            np.testing.assert_array_equal(state[name], value)
            assert state[name].dtype == value.dtype


def test_a_spilled_state_read_back_is_in_memory_and_its_file_is_gone(tmp_path) -> None:
    store = ClientStateStore(tmp_path, memory_bytes=80)
    for cid in range(3):
        store.put(cid, _state(cid))
    assert store.spilled_ids() == [0]
    np.testing.assert_array_equal(store.get(0)["model"], _state(0)["model"])
    # Reading 0 made it the most recently used: 1 is spilled instead, and 0's file removed.
    assert store.spilled_ids() == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["client_0000001.npz"]


def test_replacing_a_spilled_state_drops_its_file(tmp_path) -> None:
    store = ClientStateStore(tmp_path, memory_bytes=80)
    for cid in range(3):
        store.put(cid, _state(cid))
    newer = {"model": np.zeros(2, np.float32)}
    store.put(0, newer)
    assert not (tmp_path / "client_0000000.npz").exists()
    np.testing.assert_array_equal(store.get(0)["model"], newer["model"])


def test_clear_removes_every_state_and_spill_file(tmp_path) -> None:
    store = ClientStateStore(tmp_path, memory_bytes=80)
    for cid in range(5):
        store.put(cid, _state(cid))
    assert any(tmp_path.iterdir())
    store.clear()
    assert len(store) == 0 and store.bytes_in_memory == 0 and store.spilled_ids() == []
    assert list(tmp_path.iterdir()) == [] and store.get(3) is None
