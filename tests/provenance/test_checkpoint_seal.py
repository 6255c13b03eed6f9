"""A checkpoint's seal needs the key outside the run directory: what is edited and checksummed again without it
is refused, another machine's key is named with the fix, and the key is the user's alone."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from rayfed import CheckpointError, RunConfig, run
from rayfed.provenance.checkpoint_key import key_path
from rayfed.provenance.run_identity import RunMarker
from rayfed.results.run_data import load_run
from rayfed.util.errors import CheckpointKeyError
from rayfed.util.files import digest_of, load_arrays, save_arrays
from tests.conftest import tiny_overrides


def _config(run_dir: Path, **extra: object) -> RunConfig:
    return RunConfig().override(tiny_overrides(run_dir, **{"engine.checkpoint_every": 1, **extra}))


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A run of 2 rounds, its checkpoints of rounds 0 and 1 kept."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run(_config(run_dir))
    return run_dir


def _copy(tmp_path: Path, finished: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    (copy / "summary.json").unlink()
    return copy


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def _reseal_with_plain_sha256(path: Path, **meta_changes: object) -> None:
    """Edit the checkpoint's metadata and seal it again as anyone can without the key: the plain SHA-256 that
    checkpoints carried before they were keyed, over the arrays and the round, format and identity."""
    arrays = load_arrays(path)
    meta = {key: value for key, value in json.loads(arrays["meta"].tobytes()).items() if key not in ("mac", "key_id")}
    meta.update(meta_changes, sealed=True)
    parts = [part for name in sorted(arrays) if name != "meta" for part in (name.encode(), arrays[name])]
    fields = {key: meta[key] for key in ("round", "format", "identity", "sealed")}
    meta["checksum"] = digest_of([*parts, json.dumps(fields, sort_keys=True).encode()])
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    save_arrays(path, arrays)


def test_a_checkpoint_edited_and_checksummed_again_without_the_key_is_refused(tmp_path, finished) -> None:
    copy = _copy(tmp_path, finished)
    newest = copy / "checkpoints" / "round_000001.npz"
    arrays = load_arrays(newest)
    name = next(key for key in arrays if key.startswith("server/"))
    arrays[name] = np.zeros_like(arrays[name])  # the state overwritten
    save_arrays(newest, arrays)
    _reseal_with_plain_sha256(newest)
    before = _snapshot(copy)

    with pytest.raises(CheckpointKeyError) as refused:
        run(_config(copy, **{"train.rounds": 3}), resume=True)

    message = str(refused.value)
    assert f"checkpoint {str(newest)!r} carries a plain SHA-256 checksum" in message
    assert "cannot prove this run wrote it" in message and "\n" not in message
    assert _snapshot(copy) == before


def test_another_runs_checkpoint_given_this_runs_identity_is_refused(tmp_path, finished) -> None:
    other = tmp_path / "other"
    run(_config(other, **{"data.seed": 7}))  # the same shapes, other client data
    copy = _copy(tmp_path, finished)
    newest = copy / "checkpoints" / "round_000001.npz"
    identity = RunMarker.read(copy).identity
    for forge in ("identity only", "checksummed again"):
        shutil.copy(other / "checkpoints" / "round_000001.npz", newest)
        if forge == "checksummed again":
            _reseal_with_plain_sha256(newest, identity=identity)
        else:  # the seal left as it was
            arrays = load_arrays(newest)
            meta = json.loads(arrays["meta"].tobytes())
            arrays["meta"] = np.frombuffer(json.dumps({**meta, "identity": identity}).encode(), dtype=np.uint8)
            save_arrays(newest, arrays)
        before = _snapshot(copy)

        with pytest.raises(CheckpointError) as refused:
            run(_config(copy, **{"train.rounds": 3}), resume=True)

        expected = "carries a plain SHA-256" if forge == "checksummed again" else "is damaged or was changed"
        assert expected in str(refused.value), forge
        assert "previous checkpoint, of round 0" in str(refused.value)
        assert _snapshot(copy) == before


def test_a_checkpoint_sealed_with_another_machines_key_names_both_keys_and_the_fix(
    tmp_path, finished, monkeypatch
) -> None:
    copy = _copy(tmp_path, finished)
    mine = key_path()
    monkeypatch.setenv("RAYFED_CHECKPOINT_KEY_FILE", str(tmp_path / "elsewhere" / "checkpoint.key"))
    run(_config(tmp_path / "made here"))  # this "machine" makes its own key on first use
    before = _snapshot(copy)

    with pytest.raises(CheckpointKeyError) as refused:
        run(_config(copy, **{"train.rounds": 3}), resume=True)

    message = str(refused.value)
    assert "was sealed with the checkpoint key" in message and "but this machine's key" in message
    assert "copy the key file of the machine that wrote it to" in message
    assert "or point RAYFED_CHECKPOINT_KEY_FILE at it" in message and "\n" not in message
    assert _snapshot(copy) == before
    read = load_run(copy)  # readable without its key: figures and reports need none
    assert read.has_rounds and read.checkpoint_round == 1 and _snapshot(copy) == before
    monkeypatch.setenv("RAYFED_CHECKPOINT_KEY_FILE", str(mine))  # the key that travelled with the run
    assert run(_config(copy, **{"train.rounds": 3}), resume=True).rounds_run == 3


def test_an_unkeyed_checkpoint_resumes_once_the_user_vouches_for_it_and_is_still_checked(
    tmp_path, finished, monkeypatch
) -> None:
    copy = _copy(tmp_path, finished)
    for path in sorted((copy / "checkpoints").glob("*.npz")):
        _reseal_with_plain_sha256(path)  # as the rayfed before keyed checkpoints wrote them
    monkeypatch.setenv("RAYFED_TRUST_UNKEYED_CHECKPOINTS", "1")
    newest = copy / "checkpoints" / "round_000001.npz"
    arrays = load_arrays(newest)
    name = next(key for key in arrays if key.startswith("server/"))
    arrays[name] = arrays[name][:-1]  # cut short behind the checksum's back
    save_arrays(newest, arrays)

    with pytest.raises(CheckpointError, match=r"is damaged or was changed"):
        run(_config(copy, **{"train.rounds": 3}), resume=True)

    newest.unlink()
    assert run(_config(copy, **{"train.rounds": 3}), resume=True).rounds_run == 3
    assert "mac" in json.loads(load_arrays(copy / "checkpoints" / "round_000002.npz")["meta"].tobytes())


def test_the_key_is_made_on_first_use_for_its_owner_alone(tmp_path, monkeypatch) -> None:
    key = tmp_path / "config" / "rayfed" / "checkpoint.key"
    monkeypatch.delenv("RAYFED_CHECKPOINT_KEY_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert key_path() == key and not key.exists()

    run(_config(tmp_path / "run", **{"train.rounds": 1}))

    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert len(bytes.fromhex(key.read_text().strip())) == 32
    assert not any(path.name.endswith(".key") for path in (tmp_path / "run").rglob("*"))
