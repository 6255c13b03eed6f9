"""Bad input, as a user meets it through ``rayfed.run``: each error names the field, the value and the fix."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
import torch

from rayfed import CheckpointError, ConfigError, DatasetError, ResourceError, RunConfig, run
from rayfed.errors import CheckpointFormatError
from rayfed.io import load_arrays, save_arrays
from tests.conftest import tiny_overrides


def _run(tmp_path, **overrides: object):
    return run(RunConfig().override(tiny_overrides(tmp_path / "run", **overrides)))


@pytest.mark.parametrize(
    ("overrides", "error", "fragments"),
    [
        ({"data.classes_per_client": 11}, ConfigError, ["data.classes_per_client", "11", "10"]),
        ({"data.num_clients": 5000}, ConfigError, ["data.num_clients", "5000", "3000"]),
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
    with pytest.raises(ConfigError, match=r"algorithm.params.wdr_lambda must be a finite number >= 0, but got "
                                          r"algorithm.params.wdr_lambda=-1"):
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


def test_model_that_does_not_fit_the_dataset_names_model_and_shape(tmp_path) -> None:
    from rayfed.models import MODELS, ModelSpec, register_model
    from rayfed.models._spec import min_side_reason

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


def test_dashboard_binds_to_localhost_by_default() -> None:
    assert RunConfig().engine.dashboard_host == "127.0.0.1"
    assert RunConfig().engine.dashboard is False
