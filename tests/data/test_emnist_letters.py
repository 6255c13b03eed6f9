"""EMNIST-Letters through torchvision, on tiny stand-in IDX files the tests write themselves (offline)."""

from __future__ import annotations

import gzip
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from rayfed import RunConfig
from rayfed.config import DataConfig
from rayfed.data import load_dataset, make_partition
from rayfed.data.torchvision_data import EMNIST_LETTERS_FILES
from rayfed.engine.sizing import estimate_memory
from rayfed.util.errors import DatasetError
from tests.conftest import tiny_overrides


def _idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (uint8) in the IDX format torchvision reads: magic 0x0000 08 <ndim>, big-endian dims, data."""
    header = struct.pack(">I", 0x0800 | array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def _letters(n: int, seed: int, labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    return images, (rng.integers(1, 27, n).astype(np.uint8) if labels is None else labels.astype(np.uint8))


def _write_split(folder: Path, split: str, images: np.ndarray, labels: np.ndarray, *, gz: bool = True) -> None:
    """The two files of ``split`` as NIST ships them (``.gz``) or decompressed, into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for kind, array in (("images-idx3-ubyte", images), ("labels-idx1-ubyte", labels)):
        name = f"emnist-letters-{split}-{kind}"
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(_idx_bytes(array)))
        else:
            (folder / name).write_bytes(_idx_bytes(array))


def test_letters_load_with_labels_shifted_to_0_25_and_26_classes(tmp_path) -> None:
    # Prepare: .gz files in <root>/EMNIST/raw/, every letter present in the training split.
    raw = tmp_path / "EMNIST" / "raw"
    train_x, train_y = _letters(52, 0, np.tile(np.arange(1, 27), 2))
    test_x, test_y = _letters(8, 1)
    _write_split(raw, "train", train_x, train_y)
    _write_split(raw, "test", test_x, test_y)

    # Execute
    ds = load_dataset("emnist_letters", str(tmp_path))

    # Assert: train then test merged; pixels as stored; labels 1..26 became 0..25 with 26 outputs.
    assert ds.num_classes == 26 and ds.input_shape == (1, 28, 28) and len(ds) == 60
    np.testing.assert_array_equal(ds.images[:, 0], np.concatenate([train_x, test_x]))
    np.testing.assert_array_equal(ds.labels, np.concatenate([train_y, test_y]).astype(np.int64) - 1)
    assert ds.labels.min() == 0 and ds.labels.max() == 25
    assert ds.mean == (0.5,) and ds.std == (0.5,)
    for name in EMNIST_LETTERS_FILES:  # decompressed offline where torchvision looks for them
        assert (raw / name).is_file()


def test_na_class_keeps_labels_1_26_with_a_27_way_head_that_partitions(tmp_path) -> None:
    # Prepare
    raw = tmp_path / "EMNIST" / "raw"
    train_x, train_y = _letters(104, 7, np.tile(np.arange(1, 27), 4))
    _write_split(raw, "train", train_x, train_y)
    _write_split(raw, "test", *_letters(4, 8))

    # Execute
    ds = load_dataset("emnist_letters", str(tmp_path), options={"na_class": True, "merge_splits": False})
    part = make_partition(ds.labels, ds.num_classes, DataConfig(partition="dirichlet", num_clients=4, alpha=0.5))

    # Assert: class 0 ("N/A") exists in the head but holds no sample; every sample is placed once.
    assert ds.num_classes == 27
    np.testing.assert_array_equal(ds.labels, train_y.astype(np.int64))
    assert part.label_counts[:, 0].sum() == 0 and part.label_counts.sum() == 104


def test_letters_are_read_from_nists_gzip_zip_and_the_train_split_alone(tmp_path) -> None:
    # Prepare: only NIST's gzip.zip (its members under gzip/), in data.root itself.
    members = tmp_path / "zipped"
    train_x, train_y = _letters(10, 2)
    _write_split(members / "gzip", "train", train_x, train_y)
    _write_split(members / "gzip", "test", *_letters(4, 3))
    with zipfile.ZipFile(tmp_path / "gzip.zip", "w") as archive:
        for path in sorted((members / "gzip").iterdir()):
            archive.write(path, f"gzip/{path.name}")

    # Execute
    ds = load_dataset("emnist_letters", str(tmp_path), options={"merge_splits": False})

    # Assert: the training split only; the test files were not needed.
    assert len(ds) == 10
    np.testing.assert_array_equal(ds.labels, train_y.astype(np.int64) - 1)
    assert not (tmp_path / "EMNIST" / "raw" / EMNIST_LETTERS_FILES[2]).exists()


def test_missing_letters_files_are_named_with_the_fix(tmp_path) -> None:
    # Prepare: the training split only, but the merged pool needs the test split too.
    _write_split(tmp_path / "EMNIST" / "raw", "train", *_letters(5, 4), gz=False)

    # Execute / Assert
    with pytest.raises(DatasetError, match="EMNIST/raw/emnist-letters-test-images-idx3-ubyte") as error:
        load_dataset("emnist_letters", str(tmp_path))
    assert "data.download=true" in str(error.value) and "gzip.zip" in str(error.value)
    assert "emnist-letters-train" not in str(error.value)


def test_a_file_with_label_0_is_refused_as_not_the_letters_split(tmp_path) -> None:
    # Prepare: labels 0..9, as the digits split has.
    raw = tmp_path / "EMNIST" / "raw"
    _write_split(raw, "train", *_letters(10, 5, np.arange(10)))
    _write_split(raw, "test", *_letters(2, 6))

    # Execute / Assert
    with pytest.raises(DatasetError, match="letters split"):
        load_dataset("emnist_letters", str(tmp_path))


def test_memory_estimate_knows_emnist_letters(tmp_path) -> None:
    # Prepare
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "data.dataset": "emnist_letters",
                "data.root": str(tmp_path),
                "data.options": {},
            },
        )
    )

    # Execute
    dataset = next(part for part in estimate_memory(config).parts if part.name == "dataset")

    # Assert: 145,600 merged samples of 784 pixels and an int64 label, held once (local backend).
    assert dataset.bytes == 145_600 * (28 * 28 + 8)
