"""Bad input, as a user meets it through ``rayfed.run``: each error names the field, the value and the fix."""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import stat
import zipfile

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayfed import CheckpointError, ConfigError, DatasetError, ResourceError, RunConfig, TrainConfig, run
from rayfed.data import load_dataset, make_partition
from rayfed.data.torchvision_data import _gunzip_if_needed
from rayfed.engine.metrics import summarise_round
from rayfed.engine.trainability import check_trainable
from rayfed.execution.reports import ClientReport
from rayfed.util.errors import CheckpointFormatError
from rayfed.util.files import load_arrays, save_arrays
from tests.conftest import TINY_SAMPLES, tiny_overrides


def _run(tmp_path, **overrides: object):
    return run(RunConfig().override(tiny_overrides(tmp_path / "run", **overrides)))


@pytest.mark.parametrize(
    ("overrides", "error", "fragments"),
    [
        ({"data.classes_per_client": 11}, ConfigError, ["data.classes_per_client", "11", "10"]),
        ({"data.num_clients": 5000}, ConfigError, ["data.num_clients", "5000", str(TINY_SAMPLES)]),
        ({"data.dataset": "cifar1000"}, ConfigError, ["data.dataset='cifar1000'", "cifar100", "known"]),
        ({"model.name": "resnet99"}, ConfigError, ["model.name='resnet99'", "known", "cnn4"]),
    ],
)
def test_bad_run_inputs_fail_with_a_message_naming_the_problem(tmp_path, overrides, error, fragments) -> None:
    with pytest.raises(error) as raised:
        _run(tmp_path, **overrides)
    for fragment in fragments:
        assert fragment in str(raised.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpus_requested_on_a_machine_without_gpus(tmp_path) -> None:
    with pytest.raises(ResourceError, match=r"engine.num_gpus_per_worker=0.25 but this machine has no CUDA GPU.*=0"):
        _run(tmp_path, **{"engine.num_gpus_per_worker": 0.25})


def test_gpus_requested_on_a_ray_cluster_without_gpus(tmp_path, ray_cluster) -> None:
    if ray_cluster.cluster_resources().get("GPU"):
        pytest.skip("this cluster has GPUs")
    with pytest.raises(ResourceError, match=r"engine.num_gpus_per_worker=0.5 but the Ray cluster has no GPUs"):
        _run(tmp_path, **{"engine.backend": "ray", "engine.num_gpus_per_worker": 0.5})


def test_negative_wdr_lambda_names_the_field(tmp_path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"algorithm.params.wdr_lambda must be a finite number >= 0, but got "
        r"algorithm.params.wdr_lambda=-1",
    ):
        _run(tmp_path, **{"algorithm.name": "cwfedavg", "algorithm.params.wdr_lambda": -1})


@pytest.mark.parametrize(
    ("params", "fragments"),
    [
        (
            {"classwise_layers": ["fc", "last_feet"]},
            ["'last_feet'", "did you mean 'last_feat'", "conv1, conv2, last_feat, fc"],
        ),
        ({"classwise_layers": ["conv1"]}, ["must be the model's last blocks", "['fc']"]),
        ({"classwise_blocks": 7}, ["algorithm.params.classwise_blocks", "=7", "conv1, conv2, last_feat, fc"]),
    ],
)
def test_selective_layers_not_in_the_model_are_refused_before_anything_is_written(tmp_path, params, fragments) -> None:
    overrides = {"algorithm.name": "cwfedavg", **{f"algorithm.params.{k}": v for k, v in params.items()}}
    with pytest.raises(ConfigError) as raised:
        _run(tmp_path, **overrides)
    for fragment in fragments:
        assert fragment in str(raised.value)
    assert not (tmp_path / "run").exists()  # a corrected retry with the same run_dir is not refused


def test_model_that_does_not_fit_the_dataset_names_model_and_shape(tmp_path, monkeypatch) -> None:
    from rayfed.models import MODELS, ModelSpec, register_model
    from rayfed.models._spec import min_side_reason

    # the test's model leaves the registry with the test (test_registry_lists_every_model may run after it)
    monkeypatch.setattr(MODELS, "_items", dict(MODELS._items))
    monkeypatch.setattr(MODELS, "_origins", dict(MODELS._origins))
    if "test_needs_64px" not in MODELS:
        register_model(
            ModelSpec(
                "test_needs_64px",
                factory=lambda shape, k: torch.nn.Linear(1, k),
                supports=lambda shape: min_side_reason(shape, 64, "test model"),
                description="a test model for 64x64 inputs",
            )
        )
    with pytest.raises(ConfigError) as raised:
        _run(tmp_path, **{"model.name": "test_needs_64px"})
    assert "model.name='test_needs_64px'" in str(raised.value) and "(1, 28, 28)" in str(raised.value)


def test_dataset_root_without_files_lists_missing_files_and_fix(tmp_path) -> None:
    with pytest.raises(DatasetError) as raised:
        _run(tmp_path, **{"data.dataset": "mnist", "data.options": {}, "data.root": str(tmp_path / "empty")})
    message = str(raised.value)
    assert "train-images-idx3-ubyte" in message and "data.download=true" in message


def test_truncated_checkpoint_is_reported_not_unpickled(tmp_path) -> None:
    path = tmp_path / "ckpt.npz"
    save_arrays(path, {"a": np.arange(1000, dtype=np.float32)})
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_arrays(path)


def test_checkpoint_with_pickled_objects_is_refused(tmp_path) -> None:
    path = tmp_path / "evil.npz"
    np.savez(path, payload=np.array([{"x": 1}], dtype=object))  # would need unpickling to load
    with pytest.raises(CheckpointError):
        load_arrays(path)


def test_resume_from_corrupted_checkpoint_names_the_file(tmp_path) -> None:
    config = RunConfig().override(tiny_overrides(tmp_path / "run", **{"engine.checkpoint_every": 1}))
    run(config)
    newest = sorted((tmp_path / "run" / "checkpoints").glob("*.npz"))[-1]
    with zipfile.ZipFile(newest, "w") as broken:  # a valid zip without the arrays
        broken.writestr("nothing.txt", "x")
    with pytest.raises(CheckpointError, match=newest.name):
        run(config.override({"train.rounds": 3}), resume=True)


def test_resume_from_a_checkpoint_of_another_state_format_is_refused_untouched(tmp_path) -> None:
    config = RunConfig().override(tiny_overrides(tmp_path / "run", **{"engine.checkpoint_every": 1}))
    run(config)
    newest = sorted((tmp_path / "run" / "checkpoints").glob("*.npz"))[-1]
    arrays = load_arrays(newest)
    arrays["meta"] = np.frombuffer(b'{"round": 1, "format": 1}', dtype=np.uint8)
    save_arrays(newest, arrays)
    before = {str(p): p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with pytest.raises(CheckpointFormatError, match=r"format 1.*\(O, I, H, W\).*version that wrote it"):
        run(config.override({"train.rounds": 3}), resume=True)
    assert {str(p): p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("renamed", [False, True])
def test_a_checkpoint_whose_round_was_edited_is_refused_untouched(tmp_path, renamed: bool) -> None:
    # Prepare: the newest checkpoint (round 1) says round 0, under its own name or renamed to match.
    config = RunConfig().override(tiny_overrides(tmp_path / "run", **{"engine.checkpoint_every": 1}))
    run(config)
    first, newest = sorted((tmp_path / "run" / "checkpoints").glob("*.npz"))
    arrays = load_arrays(newest)
    meta = json.loads(arrays["meta"].tobytes())
    arrays["meta"] = np.frombuffer(json.dumps({**meta, "round": 0}).encode(), dtype=np.uint8)
    save_arrays(newest, arrays)
    if renamed:
        first.unlink()
        newest = newest.rename(first)
    before = {str(p): p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}

    # Execute
    with pytest.raises(CheckpointError) as raised:
        run(config.override({"train.rounds": 3}), resume=True)

    # Assert: the file is named with what is wrong with it, and nothing in the run directory changed.
    assert newest.name in str(raised.value)
    assert ("do not match the seal" if renamed else "not the round its name says") in str(raised.value)
    assert {str(p): p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before


def test_dashboard_binds_to_localhost_by_default() -> None:
    assert RunConfig().engine.dashboard_host == "127.0.0.1"
    assert RunConfig().engine.dashboard is False


# --- untrainable configs: train.batch_size against the clients' training data ------------------


def _train_sizes(tmp_path) -> np.ndarray:
    config = RunConfig().override(tiny_overrides(tmp_path / "unused"))
    dataset = load_dataset(config.data.dataset, None, seed=config.data.seed, options=config.data.options)
    return make_partition(dataset.labels, dataset.num_classes, config.data).num_train()


def test_batch_larger_than_every_client_is_refused_before_anything_is_written(tmp_path) -> None:
    largest = int(_train_sizes(tmp_path).max())
    with pytest.raises(ConfigError) as raised:
        _run(tmp_path, **{"train.batch_size": 1000})
    message = str(raised.value)
    assert message.startswith("no client can take a local step: all 10 clients hold fewer than train.batch_size=1000")
    assert f"the largest client trains on {largest} samples" in message
    assert f"train.batch_size<={largest}, train.drop_last=false, or fewer clients (data.num_clients)" in message
    assert not (tmp_path / "run").exists()


def test_clients_smaller_than_a_batch_are_named_once_and_left_out_of_the_round_loss(tmp_path, caplog) -> None:
    sizes = _train_sizes(tmp_path)
    batch = int(np.sort(sizes)[3]) + 1  # four clients cannot fill one batch
    stuck = sorted(int(c) for c in np.flatnonzero(sizes < batch))
    with caplog.at_level(logging.WARNING, logger="rayfed"):
        result = _run(tmp_path, **{"train.batch_size": batch})
    warnings = [r.getMessage() for r in caplog.records if r.name == "rayfed.engine.trainability"]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        f"4 of 10 clients ({', '.join(map(str, stuck))}) hold fewer than "
        f"train.batch_size={batch} training samples and train.drop_last=true"
    )
    assert f"use train.batch_size<={int(sizes.min())}, train.drop_last=false" in warnings[0]  # lets every client step
    clients = pq.read_table(tmp_path / "run" / "clients" / "round_000000.parquet").to_pylist()
    idle = [r for r in clients if r["steps"] == 0]
    assert sorted(r["client_id"] for r in idle) == stuck and all(math.isnan(r["train_loss"]) for r in idle)
    assert all(math.isfinite(row["train_loss"]) for row in result.history)


def test_warning_lists_the_first_clients_and_counts_the_rest(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="rayfed.engine.trainability"):
        check_trainable(np.array([5, 40, 3, 100, 2, 1, 0, 9, 70]), TrainConfig(batch_size=10))
    message = caplog.records[0].getMessage()
    assert message.startswith("6 of 9 clients (0, 2, 4, 5, 6 and 1 more) hold fewer than")
    assert message.endswith(
        "give every client data: raise data.min_samples or data.train_fraction, or use fewer clients"
    )  # client 6 holds nothing: no batch size lets it step


def test_clients_without_training_data_are_refused_even_without_drop_last() -> None:
    with pytest.raises(ConfigError, match=r"all 3 clients hold no training sample .* raise data.min_samples"):
        check_trainable(np.zeros(3, dtype=np.int64), TrainConfig(drop_last=False))


def test_round_in_which_no_client_stepped_warns_and_its_loss_is_not_an_average_of_nans(caplog) -> None:
    def report(cid: int, steps: int, loss: float) -> ClientReport:
        return ClientReport(
            cid, 10, loss, steps=steps, update_norm=0.0, bytes_up=0, bytes_down=0, seconds=0.0, trained_steps=steps
        )

    mixed = summarise_round(0, [report(0, 0, math.nan), report(1, 2, 0.5), report(2, 2, 1.5)], [], {}, {})
    assert mixed.train_loss == 1.0
    with caplog.at_level(logging.WARNING, logger="rayfed.engine.metrics"):
        idle = summarise_round(3, [report(0, 0, math.nan), report(1, 0, math.nan)], [], {}, {})
    assert math.isnan(idle.train_loss)
    assert "round 3: none of the 2 sampled clients took a local step" in caplog.text
    assert "train_loss is NaN" in caplog.text


# --- files a team can share ---------------------------------------------------------------------


def test_run_directory_files_follow_the_umask(tmp_path) -> None:
    previous = os.umask(0o022)
    try:
        _run(tmp_path, **{"engine.checkpoint_every": 1})
    finally:
        os.umask(previous)
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert {p.relative_to(tmp_path / "run").parts[0] for p in files} >= {
        "config.json",
        "partition.parquet",
        "rounds.parquet",
        "clients",
        "checkpoints",
        "summary.json",
    }
    modes = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert set(modes.values()) == {"0o644"}, modes
    dirs = [p for p in (tmp_path / "run").rglob("*") if p.is_dir()]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o755 for p in dirs)


def test_decompressed_dataset_files_follow_the_umask(tmp_path) -> None:
    archive = tmp_path / "train-labels-idx1-ubyte.gz"
    with gzip.open(archive, "wb") as out:
        out.write(b"\x00" * 16)
    previous = os.umask(0o027)
    try:
        _gunzip_if_needed("mnist", archive, md5=None)
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "train-labels-idx1-ubyte").stat().st_mode) == 0o640
