"""No run can eat another: a run directory has one owner, and a checkpoint proves which run wrote it.

Each case is one way a user's results were lost or mixed up: two runs in one directory, a
folder rayfed did not make, a checkpoint copied from another run, damaged or not finite, and a
resume that changes ``train.rounds`` below what the run holds. Every refusal names the file and
the fix and leaves the directory as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import CheckpointError, ConfigError, RunConfig, run
from rayfed.engine import Simulation
from rayfed.engine.callbacks import Callback
from rayfed.engine.checkpoint import load_checkpoint, save_checkpoint
from rayfed.provenance.run_identity import MARKER_FILE, RunMarker
from rayfed.provenance.run_lock import LOCK_FILE
from rayfed.util.errors import CheckpointFormatError
from rayfed.util.files import load_arrays, save_arrays
from tests.conftest import tiny_overrides

_SMALL = {
    "data.options": {"num_samples": 1000},
    "train.batch_size": 25,
    "train.rounds": 3,
    "engine.checkpoint_every": 1,
}


def _config(run_dir: Path, **extra: object) -> RunConfig:
    """3 rounds of 10 clients on 1,000 synthetic samples, in-process, a checkpoint after every round."""
    return RunConfig().override(tiny_overrides(run_dir, **{**_SMALL, **extra}))


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def _accuracies(run_dir: Path) -> list[float]:
    return [row["accuracy"] for row in pq.read_table(run_dir / "rounds.parquet").to_pylist()]


class _During(Callback):
    """Calls ``action`` once, after round 0 is recorded, while the run holds its directory."""

    def __init__(self, action) -> None:
        self.action, self.outcome = action, None

    def after_round(self, run, record, clients) -> bool:
        if record.round == 0:
            self.outcome = self.action()
        return False


def _refusal(action) -> BaseException | None:
    try:
        action()
    except ConfigError as error:
        return error
    return None


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """An uninterrupted run of 3 rounds (checkpoints of rounds 1 and 2 kept)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run(_config(run_dir))
    return run_dir


# --- one owner ------------------------------------------------------------------------------------
def test_a_second_run_or_resume_of_a_directory_in_use_is_refused_naming_its_owner(tmp_path) -> None:
    run_dir = tmp_path / "run"
    other = Simulation(_config(run_dir, **{"train.lr": 0.05, "train.rounds": 2}))  # planned before the first started

    def second_runs() -> tuple:
        before = _snapshot(run_dir)
        return (_refusal(other.run), _refusal(lambda: run(_config(run_dir), resume=True)), before == _snapshot(run_dir))

    during = _During(second_runs)
    result = run(_config(run_dir), callbacks=[during])
    started, resumed, untouched = during.outcome
    for refused in (started, resumed):
        assert refused is not None and "is in use by another run" in str(refused)
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in str(refused)
    assert untouched and result.rounds_run == 3
    assert json.loads((run_dir / "config.json").read_text())["train"]["lr"] == 0.005  # the owner's config only
    assert not (run_dir / LOCK_FILE).exists()  # the lock goes with the run


def test_a_lock_left_by_a_dead_run_is_named_and_taken_over(tmp_path, caplog) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_FILE).write_text(
        json.dumps({"process": f"{socket.gethostname()}:{dead.pid}:1", "started": "2026-01-01T00:00:00"})
    )
    run(_config(run_dir, **{"train.rounds": 1}))
    assert f"taking over the lock left by a run that no longer runs (pid {dead.pid}" in caplog.text
    assert not (run_dir / LOCK_FILE).exists()


def test_a_lock_held_on_another_host_is_refused_with_the_file_to_delete(tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_FILE).write_text(json.dumps({"process": "elsewhere:42:7", "started": "2026-01-01T00:00:00"}))
    with pytest.raises(ConfigError, match=r"pid 42 on host elsewhere.*if it has ended, delete '.*rayfed.lock'"):
        run(_config(run_dir))
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]


# --- only rayfed's own directories ------------------------------------------------------------------
def test_a_folder_with_files_rayfed_did_not_write_is_refused_and_left_as_it_was(tmp_path, finished) -> None:
    user = tmp_path / "mine"
    shutil.copytree(finished, user)
    (user / MARKER_FILE).unlink()
    (user / "config.json").unlink()  # an old run whose config and marker are gone, or the user's own files
    before = _snapshot(user)
    with pytest.raises(ConfigError) as refused:
        run(_config(user, **{"data.alpha": 0.5, "data.partition": "dirichlet"}))
    message = str(refused.value)
    assert "is not a rayfed run directory" in message and "overwriting checkpoints, clients, " in message
    assert "choose a new run_dir" in message
    assert _snapshot(user) == before


def test_a_run_directory_whose_config_was_deleted_is_refused(tmp_path, finished) -> None:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    (copy / "config.json").unlink()
    before = _snapshot(copy)
    for resume in (False, True):
        with pytest.raises(ConfigError, match=r"holds a run whose config.json is missing \(checkpoints, clients"):
            run(_config(copy), resume=resume)
    assert _snapshot(copy) == before


# --- checkpoints that prove where they came from ----------------------------------------------------
def _stopped_after_round_2(tmp_path: Path, finished: Path) -> Path:
    """A copy of ``finished`` without its summary, resumable to 4 rounds from its checkpoint of round 2."""
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    (copy / "summary.json").unlink()
    return copy


def test_a_checkpoint_of_another_run_is_refused_and_the_previous_one_offered(tmp_path, finished) -> None:
    other = tmp_path / "other"
    run(_config(other, **{"data.seed": 7}))  # the same shapes, other client data
    copy = _stopped_after_round_2(tmp_path, finished)
    newest = copy / "checkpoints" / "round_000002.npz"
    shutil.copy(other / "checkpoints" / "round_000002.npz", newest)
    before = _snapshot(copy)
    with pytest.raises(CheckpointError) as refused:
        run(_config(copy, **{"train.rounds": 4}), resume=True)
    message = str(refused.value)
    assert f"checkpoint {str(newest)!r} was written by another run" in message
    assert f"resume from the previous checkpoint, of round 1: rm {newest}" in message and "\n" not in message
    assert _snapshot(copy) == before
    # Following the advice resumes from round 1 and matches the uninterrupted run.
    newest.unlink()
    resumed = run(_config(copy, **{"train.rounds": 3}), resume=True)
    assert resumed.accuracies == _accuracies(finished)


@pytest.mark.parametrize("damage", ["nan", "resized"])
def test_a_damaged_or_non_finite_checkpoint_is_refused_in_one_line(tmp_path, finished, damage) -> None:
    copy = _stopped_after_round_2(tmp_path, finished)
    newest = copy / "checkpoints" / "round_000002.npz"
    checkpoint = load_checkpoint(newest)
    identity = RunMarker.read(copy).identity
    server = {name: np.array(value) for name, value in checkpoint.server.items()}
    name = next(iter(server))
    if damage == "nan":  # written as rayfed writes it: its checksum holds, its values do not
        server[name][:3] = np.nan
        save_checkpoint(copy, 2, server, checkpoint.clients.items(), identity)
    else:  # one array cut short behind the checksum's back
        arrays = load_arrays(newest)
        arrays[f"server/{name}"] = arrays[f"server/{name}"][:-5]
        np.savez(newest, **arrays)
    with pytest.raises(CheckpointError) as refused:
        run(_config(copy, **{"train.rounds": 4}), resume=True)
    message = str(refused.value)
    damaged = "is damaged or was changed: its arrays or its metadata do not match the seal"
    expected = f"3 NaN or infinite values in 'server/{name}'" if damage == "nan" else damaged
    assert str(newest) in message and expected in message and "previous checkpoint, of round 1" in message
    assert "\n" not in message


def test_a_checkpoint_of_the_wrong_shape_is_named_with_the_fix(tmp_path, finished) -> None:
    copy = _stopped_after_round_2(tmp_path, finished)
    checkpoint = load_checkpoint(copy / "checkpoints" / "round_000002.npz")
    server = {name: np.zeros(7, np.float32) for name in checkpoint.server}
    save_checkpoint(copy, 2, server, checkpoint.clients.items(), RunMarker.read(copy).identity)
    with pytest.raises(CheckpointError, match=r"holds shape \(7,\) for the server state .* keeps shape") as refused:
        run(_config(copy, **{"train.rounds": 4}), resume=True)
    assert "delete it to resume from the previous checkpoint, of round 1" in str(refused.value)


def test_a_checkpoint_of_another_format_offers_the_previous_sound_one(tmp_path, finished) -> None:
    copy = _stopped_after_round_2(tmp_path, finished)
    newest = copy / "checkpoints" / "round_000002.npz"
    arrays = load_arrays(newest)
    meta = json.loads(arrays["meta"].tobytes())
    arrays["meta"] = np.frombuffer(json.dumps({**meta, "format": 1}).encode(), dtype=np.uint8)
    save_arrays(newest, arrays)
    before = _snapshot(copy)
    with pytest.raises(CheckpointFormatError) as refused:
        run(_config(copy, **{"train.rounds": 4}), resume=True)
    message = str(refused.value)
    assert f"checkpoint {str(newest)!r} has state format 1, this rayfed reads format 2" in message
    assert f"delete it to resume from the previous checkpoint, of round 1: rm {newest}" in message
    assert "\n" not in message and _snapshot(copy) == before


def test_resume_never_states_fewer_rounds_than_it_holds_and_records_a_change(tmp_path, finished) -> None:
    copy = _stopped_after_round_2(tmp_path, finished)
    before = _snapshot(copy)
    with pytest.raises(ConfigError, match=r"train.rounds=1 is fewer than the 3 rounds the run in .* holds"):
        run(_config(copy, **{"train.rounds": 1}), resume=True)
    assert _snapshot(copy) == before
    run(_config(copy, **{"train.rounds": 4}), resume=True)
    marker = json.loads((copy / MARKER_FILE).read_text())
    assert [(e["rounds"], e["from_round"], e.get("change")) for e in marker["train_rounds"]] == [
        (3, 0, None),
        (4, 3, "extended from 3 to 4"),
    ]
    assert json.loads((copy / "config.json").read_text())["train"]["rounds"] == 4
