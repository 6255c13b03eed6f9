"""The PFLlib-format dataset: a folder as PFLlib's ``save_file`` writes it, trained on exactly as given.

The folders here are written the way PFLlib's generators write them (``dataset/utils/dataset_utils.py``,
``save_file``): ``config.json`` and, per client, ``train/<i>.npz`` and ``test/<i>.npz``, each an
``np.savez_compressed(f, data={"x": ..., "y": ...})`` of the generator's normalised float32 images.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import RunConfig, run
from rayfed.config import DataConfig
from rayfed.data import load_dataset, make_partition, model_inputs
from rayfed.util.errors import ConfigError, DatasetError
from tests.conftest import tiny_overrides


def _write_folder(root: Path, sizes: list[tuple[int, int]], seed: int = 0) -> dict[str, list[dict[str, np.ndarray]]]:
    """A PFLlib folder of len(sizes) clients with (train, test) samples each: uint8 images normalised as
    ToTensor + Normalize(0.5, 0.5) do it, in float32; returns what each file holds."""
    rng = np.random.default_rng(seed)
    files: dict[str, list[dict[str, np.ndarray]]] = {"train": [], "test": []}
    for split in files:
        (root / split).mkdir(parents=True, exist_ok=True)
    for i, counts in enumerate(sizes):
        for split, n in zip(("train", "test"), counts):
            pixels = rng.integers(0, 256, size=(n, 1, 28, 28)).astype(np.uint8)
            data = {
                "x": ((pixels.astype(np.float32) / 255 - 0.5) / 0.5).astype(np.float32),
                "y": rng.integers(0, 10, size=n).astype(np.int64),
            }
            with open(root / split / f"{i}.npz", "wb") as f:
                np.savez_compressed(f, data=data)
            files[split].append(data)
    config = {
        "num_clients": len(sizes),
        "num_classes": 10,
        "non_iid": True,
        "balance": False,
        "partition": "dir",
        "alpha": 0.1,
        "batch_size": 10,
    }
    (root / "config.json").write_text(json.dumps(config))
    return files


def test_each_client_trains_and_tests_on_its_own_files_exactly(tmp_path: Path) -> None:
    # Prepare: 3 clients of unequal sizes.
    files = _write_folder(tmp_path / "MNIST", [(30, 10), (12, 4), (21, 7)])
    data = DataConfig(dataset="pfllib", partition="pfllib", root=str(tmp_path / "MNIST"), num_clients=3)
    # Execute
    dataset = load_dataset("pfllib", data.root)
    partition = make_partition(dataset.labels, dataset.num_classes, data)
    # Assert: the normalised inputs of client i's rows are its file's floats, bit for bit and in order.
    for i in range(3):
        for split, indices in (("train", partition.train(i)), ("test", partition.test(i))):
            expected = files[split][i]
            got = model_inputs(dataset.inputs[indices], dataset.mean, dataset.std).numpy()
            assert np.array_equal(got, expected["x"]) and np.array_equal(dataset.labels[indices], expected["y"])
    assert partition.num_train().tolist() == [30, 12, 21] and partition.num_test().tolist() == [10, 4, 7]


def test_a_run_on_a_pfllib_folder_trains_its_clients(tmp_path: Path) -> None:
    # Prepare / Execute: one round of FedAvg on the folder.
    _write_folder(tmp_path / "MNIST", [(30, 10), (20, 10)])
    result = run(
        RunConfig().override(
            tiny_overrides(
                tmp_path / "run",
                **{
                    "data.dataset": "pfllib",
                    "data.partition": "pfllib",
                    "data.root": str(tmp_path / "MNIST"),
                    "data.num_clients": 2,
                    "data.options": {},
                    "train.rounds": 1,
                },
            )
        )
    )
    # Assert: the clients' own sizes drove the steps (3 and 2 batches of 10).
    clients = {r["client_id"]: r for r in pq.read_table(tmp_path / "run" / "clients").to_pylist() if r["sampled"]}
    assert (clients[0]["steps"], clients[1]["steps"]) == (3, 2) and result.rounds_run == 1


def test_bad_folders_and_settings_are_refused_naming_the_field(tmp_path: Path) -> None:
    root = tmp_path / "MNIST"
    _write_folder(root, [(10, 5), (10, 5)])
    with pytest.raises(ConfigError, match="data.partition='pfllib'"):
        DataConfig(dataset="pfllib", partition="dirichlet", root=str(root))
    with pytest.raises(ConfigError, match="data.num_clients=2"):
        data = DataConfig(dataset="pfllib", partition="pfllib", root=str(root), num_clients=5)
        make_partition(load_dataset("pfllib", str(root)).labels, 10, data)
    with pytest.raises(ConfigError, match="data.root"):
        load_dataset("pfllib", None)
    with pytest.raises(DatasetError, match="config.json"):
        load_dataset("pfllib", str(tmp_path))
    with pytest.raises(DatasetError, match="data.options.mean"):  # the floats are not 0.5/0.5-normalised bytes
        load_dataset("pfllib", str(root), options={"mean": 0.1307, "std": 0.3081})
    (root / "test" / "1.npz").unlink()
    with pytest.raises(DatasetError, match="lacks 1.npz"):
        load_dataset("pfllib", str(root))


class _Shell:
    """An object a hostile file could ask the unpickler to build."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (eval, ("'never evaluated'",))


def test_a_file_that_asks_for_anything_but_arrays_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "MNIST"
    _write_folder(root, [(10, 5)])
    with open(root / "train" / "0.npz", "wb") as f:
        np.savez(f, data=np.array({"x": _Shell(), "y": np.zeros(1)}, dtype=object))
    with pytest.raises(DatasetError, match="refusing to load builtins.eval"):
        load_dataset("pfllib", str(root))


def test_extra_files_are_said_and_bad_shapes_and_labels_name_their_file(tmp_path: Path, caplog) -> None:
    root = tmp_path / "MNIST"
    _write_folder(root, [(10, 5), (10, 5)])
    # Extra files beyond config.json's num_clients: read without them, and said.
    (root / "test" / "2.npz").write_bytes((root / "test" / "1.npz").read_bytes())
    with caplog.at_level("WARNING", logger="rayfed.data.pfllib_folder"):
        assert len(load_dataset("pfllib", str(root))) == 30
    assert "test/ also holds 2.npz, which config.json's num_clients=2 leaves out" in caplog.text
    # A label outside num_classes names the file and config.json's num_classes.
    with open(root / "train" / "1.npz", "wb") as f:
        np.savez_compressed(f, data={"x": np.zeros((3, 1, 28, 28), np.float32) - 1, "y": np.array([0, 10, 2])})
    with pytest.raises(DatasetError, match=r"train/1.npz' holds label 10, outside the num_classes=10 classes"):
        load_dataset("pfllib", str(root))
    # Images of another shape name the files that differ.
    with open(root / "train" / "1.npz", "wb") as f:
        np.savez_compressed(f, data={"x": np.zeros((3, 1, 14, 14), np.float32) - 1, "y": np.array([0, 1, 2])})
    with pytest.raises(DatasetError, match=r"\(1, 28, 28\) in train/0.npz; \(1, 14, 14\) in train/1.npz"):
        load_dataset("pfllib", str(root))
