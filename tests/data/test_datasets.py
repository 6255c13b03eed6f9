"""Dataset loaders (synthetic, torchvision-backed, Tiny ImageNet), the registry and transforms.

Real files are read only for MNIST, from the data root named by the environment variable
``RAYFED_TEST_DATA`` (a folder holding ``MNIST/raw/*.gz``; that test is skipped without it);
the other loaders are tested on small stand-ins written here in each dataset's on-disk
format, read by torchvision's own loading code. Every test that touches files runs with the
network disabled.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import shutil
import socket
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets as tvd

from rayfed.data import ArrayDataset, load_dataset, make_synthetic, normalize_batch
from rayfed.util.errors import ConfigError, DatasetError

TEST_DATA = Path(os.environ["RAYFED_TEST_DATA"]).expanduser() if os.environ.get("RAYFED_TEST_DATA") else None
"""A data root with the real MNIST files (``RAYFED_TEST_DATA``), or None."""
MNIST_FILES = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every socket connection fail, so a test proves it stays offline."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- synthetic


def test_synthetic_is_identical_for_the_same_seed_and_differs_for_another():
    # Execute
    first = make_synthetic(3, num_samples=500)
    again = make_synthetic(3, num_samples=500)
    other = make_synthetic(4, num_samples=500)

    # Assert
    assert first.images.tobytes() == again.images.tobytes()
    np.testing.assert_array_equal(first.labels, again.labels)
    assert first.images.tobytes() != other.images.tobytes()


def test_synthetic_bytes_do_not_depend_on_the_number_of_threads():
    # Execute
    one = make_synthetic(0, num_samples=4000, num_threads=1)
    two = make_synthetic(0, num_samples=4000, num_threads=2)

    # Assert
    assert one.images.tobytes() == two.images.tobytes()


def test_synthetic_defaults_to_mnist_shaped_balanced_classes():
    # Execute
    ds = load_dataset("synthetic", None, seed=0, options={"num_samples": 1000})

    # Assert
    assert ds.images.shape == (1000, 1, 28, 28)
    assert ds.images.dtype == np.uint8 and ds.images.flags.c_contiguous
    assert ds.labels.dtype == np.int64
    assert ds.num_classes == 10
    assert np.bincount(ds.labels).tolist() == [100] * 10
    assert ds.mean == (0.5,) and ds.std == (0.5,)
    assert ds.input_shape == (1, 28, 28) and len(ds) == 1000


@pytest.mark.parametrize(("image_size", "num_classes"), [(32, 10), (64, 100)])
def test_synthetic_stands_in_for_colour_datasets(image_size, num_classes):
    # Execute
    ds = load_dataset(
        "synthetic",
        None,
        options={"num_samples": 200, "channels": 3, "image_size": image_size, "num_classes": num_classes},
    )

    # Assert
    assert ds.images.shape == (200, 3, image_size, image_size)
    assert ds.num_classes == num_classes
    assert ds.mean == (0.5, 0.5, 0.5)
    assert ds.labels.max() == num_classes - 1


def test_synthetic_classes_differ_on_average():
    # Prepare
    ds = make_synthetic(0, num_samples=2000)

    # Execute
    means = np.stack([ds.images[ds.labels == k].mean(axis=0) for k in range(10)]).reshape(10, -1)

    # Assert: no two class-mean images coincide
    distances = np.linalg.norm(means[:, None] - means[None], axis=-1)
    assert distances[~np.eye(10, dtype=bool)].min() > 5.0


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"num_classes": 1}, "data.options.num_classes"),
        ({"num_classes": 101}, "num_classes=101"),
        ({"channels": 2}, "channels=2"),
        ({"image_size": 30}, "image_size=30"),
        ({"num_samples": 0}, "num_samples=0"),
        ({"num_samples": "many"}, "num_samples='many'"),
    ],
)
def test_synthetic_rejects_bad_option_values(options, fragment):
    # Execute / Assert
    with pytest.raises(ConfigError, match=fragment):
        load_dataset("synthetic", None, options=options)


# --------------------------------------------------------------------------- registry


def test_unknown_dataset_name_lists_the_known_datasets():
    # Execute / Assert
    with pytest.raises(ConfigError) as info:
        load_dataset("mnits", "/tmp")
    message = str(info.value)
    assert "data.dataset='mnits'" in message
    for name in ("cifar10", "cifar100", "fashion_mnist", "mnist", "synthetic", "tiny_imagenet"):
        assert name in message


def test_unknown_dataset_option_names_it_and_lists_the_allowed_ones():
    # Execute / Assert
    with pytest.raises(ConfigError) as info:
        load_dataset("synthetic", None, options={"num_sample": 10})
    message = str(info.value)
    assert "data.options.num_sample" in message
    assert "channels, image_size, num_classes, num_samples" in message


def test_torchvision_dataset_without_root_raises_config_error():
    # Execute / Assert
    with pytest.raises(ConfigError, match=r"data\.root"):
        load_dataset("mnist", None)


# --------------------------------------------------------------------------- MNIST / Fashion-MNIST


@pytest.mark.skipif(
    TEST_DATA is None or not (TEST_DATA / "MNIST").is_dir(),
    reason="no real MNIST: set RAYFED_TEST_DATA to a data root holding MNIST/raw/*.gz",
)
def test_mnist_loads_the_merged_70k_pool_from_gzip_files_offline(tmp_path: Path, no_network: None):
    # Prepare: only the original .gz files, in a writable copy
    root = tmp_path / "data"
    assert TEST_DATA is not None
    shutil.copytree(TEST_DATA / "MNIST", root / "MNIST")
    (root / "MNIST").chmod(0o755)
    for path in (root / "MNIST").rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)

    # Execute
    merged = load_dataset("mnist", str(root))
    train_only = load_dataset("mnist", str(root), options={"merge_splits": False})

    # Assert
    assert merged.images.shape == (70_000, 1, 28, 28)
    assert merged.images.flags.c_contiguous
    assert np.bincount(merged.labels[:60_000]).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert np.bincount(merged.labels[60_000:]).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert len(train_only) == 60_000
    np.testing.assert_array_equal(train_only.images[:100], merged.images[:100])


def test_mnist_missing_files_error_names_root_files_and_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None
):
    # Prepare: two of the four files present (as junk-free gzip IDX stand-ins)
    raw = tmp_path / "MNIST" / "raw"
    write_idx_pair(raw, "train", np.zeros((3, 28, 28), np.uint8), np.zeros(3, np.uint8))
    trust_stand_in_gz_md5s(monkeypatch, tvd.MNIST, raw)

    # Execute
    with pytest.raises(DatasetError) as info:
        load_dataset("mnist", str(tmp_path))

    # Assert
    message = str(info.value)
    assert "'mnist'" in message and str(tmp_path) in message
    assert "MNIST/raw/t10k-images-idx3-ubyte.gz" in message
    assert "MNIST/raw/t10k-labels-idx1-ubyte.gz" in message
    assert "train-images" not in message.split("Fix")[0]
    assert "data.download=true" in message
    assert str(raw) in message


def test_fashion_mnist_loads_a_gzip_idx_stand_in_through_torchvision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None
):
    # Prepare
    rng = np.random.default_rng(0)
    train_x, test_x = (rng.integers(0, 256, (n, 28, 28), dtype=np.uint8) for n in (6, 4))
    train_y, test_y = np.array([0, 1, 2, 3, 4, 9], np.uint8), np.array([5, 6, 7, 8], np.uint8)
    raw = tmp_path / "FashionMNIST" / "raw"
    write_idx_pair(raw, "train", train_x, train_y)
    write_idx_pair(raw, "t10k", test_x, test_y)
    trust_stand_in_gz_md5s(monkeypatch, tvd.FashionMNIST, raw)

    # Execute
    ds = load_dataset("fashion_mnist", str(tmp_path))

    # Assert
    assert ds.name == "fashion_mnist" and ds.num_classes == 10
    np.testing.assert_array_equal(ds.images[:, 0], np.concatenate([train_x, test_x]))
    assert ds.labels.tolist() == [0, 1, 2, 3, 4, 9, 5, 6, 7, 8]


def test_a_damaged_mnist_archive_is_refused_with_the_fix(tmp_path: Path, no_network: None):
    # Prepare: a truncated download, whose checksum is not torchvision's
    raw = tmp_path / "MNIST" / "raw"
    write_idx_pair(raw, "train", np.zeros((3, 28, 28), np.uint8), np.zeros(3, np.uint8))
    archive = raw / "train-images-idx3-ubyte.gz"
    archive.write_bytes(archive.read_bytes()[:20])

    # Execute
    with pytest.raises(DatasetError) as info:
        load_dataset("mnist", str(tmp_path), download=True)

    # Assert: never used anyway; the fix is to fetch it again
    message = str(info.value)
    assert f"{str(archive)!r} is damaged" in message and "its MD5 checksum is not torchvision's" in message
    assert "delete it and run again with data.download=true" in message and "\n" not in message
    assert not (raw / "train-images-idx3-ubyte").exists()


def trust_stand_in_gz_md5s(monkeypatch: pytest.MonkeyPatch, cls: type, raw: Path) -> None:
    """Point torchvision's checksums of the MNIST family at the stand-in ``.gz`` files that exist in ``raw``."""
    monkeypatch.setattr(
        cls,
        "resources",
        [(name, md5(raw / name) if (raw / name).exists() else checksum) for name, checksum in cls.resources],
    )


def write_idx_pair(raw: Path, prefix: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Write gzip IDX files as distributed by MNIST-style datasets (magic 2051 / 2049)."""
    raw.mkdir(parents=True, exist_ok=True)
    n, rows, cols = images.shape
    with gzip.open(raw / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, rows, cols) + images.tobytes())
    with gzip.open(raw / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 2049, n) + labels.astype(np.uint8).tobytes())


# --------------------------------------------------------------------------- CIFAR


def write_cifar(folder: Path, files: dict[str, dict], meta_name: str, meta: dict) -> None:
    folder.mkdir(parents=True)
    for name, entry in {**files, meta_name: meta}.items():
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f)


def trust_stand_in_md5s(monkeypatch: pytest.MonkeyPatch, cls: type, folder: Path) -> None:
    """Point torchvision's checksum lists at the stand-in files, so its integrity check runs for real."""
    for attr in ("train_list", "test_list"):
        monkeypatch.setattr(cls, attr, [[name, md5(folder / name)] for name, _ in getattr(cls, attr)])
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": md5(folder / cls.meta["filename"])})


def test_cifar10_loads_a_stand_in_through_torchvision_and_merges_train_then_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None
):
    # Prepare: 5 train batches of 2 images, 1 test batch of 3, rows are CHW-flattened
    rng = np.random.default_rng(0)
    batches = {f"data_batch_{b}": rng.integers(0, 256, (2, 3072), dtype=np.uint8) for b in range(1, 6)}
    batches["test_batch"] = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
    labels = {name: [i % 10 for i in range(len(x))] for name, x in batches.items()}
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(
        folder,
        {name: {"data": x, "labels": labels[name]} for name, x in batches.items()},
        "batches.meta",
        {"label_names": [f"class{i}" for i in range(10)]},
    )
    trust_stand_in_md5s(monkeypatch, tvd.CIFAR10, folder)

    # Execute
    ds = load_dataset("cifar10", str(tmp_path))
    train_only = load_dataset("cifar10", str(tmp_path), options={"merge_splits": False})

    # Assert
    expected = np.concatenate(list(batches.values())).reshape(-1, 3, 32, 32)
    np.testing.assert_array_equal(ds.images, expected)
    assert ds.images.flags.c_contiguous
    assert ds.labels.tolist() == [0, 1] * 5 + [0, 1, 2]
    assert ds.num_classes == 10 and ds.input_shape == (3, 32, 32)
    assert len(train_only) == 10


def test_cifar100_loads_fine_labels_from_a_stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None):
    # Prepare
    rng = np.random.default_rng(1)
    train_x, test_x = rng.integers(0, 256, (4, 3072), dtype=np.uint8), rng.integers(0, 256, (2, 3072), dtype=np.uint8)
    folder = tmp_path / "cifar-100-python"
    write_cifar(
        folder,
        {
            "train": {"data": train_x, "fine_labels": [99, 0, 50, 7], "coarse_labels": [0, 0, 0, 0]},
            "test": {"data": test_x, "fine_labels": [3, 98], "coarse_labels": [0, 0]},
        },
        "meta",
        {"fine_label_names": [f"fine{i}" for i in range(100)], "coarse_label_names": ["c"]},
    )
    trust_stand_in_md5s(monkeypatch, tvd.CIFAR100, folder)

    # Execute
    ds = load_dataset("cifar100", str(tmp_path))

    # Assert
    assert ds.num_classes == 100
    assert ds.labels.tolist() == [99, 0, 50, 7, 3, 98]
    np.testing.assert_array_equal(ds.images, np.concatenate([train_x, test_x]).reshape(-1, 3, 32, 32))


def test_cifar10_missing_files_error_lists_them(tmp_path: Path, no_network: None):
    # Execute
    with pytest.raises(DatasetError) as info:
        load_dataset("cifar10", str(tmp_path))

    # Assert
    message = str(info.value)
    assert "cifar-10-batches-py/data_batch_1" in message
    assert "cifar-10-batches-py/test_batch" in message
    assert "cifar-10-batches-py/batches.meta" in message
    assert "data.download=true" in message and str(tmp_path) in message


def test_cifar10_with_wrong_checksums_raises_dataset_error(tmp_path: Path, no_network: None):
    # Prepare: all files present, but not the real ones (md5s differ)
    folder = tmp_path / "cifar-10-batches-py"
    names = [f"data_batch_{b}" for b in range(1, 6)] + ["test_batch"]
    write_cifar(folder, {n: {"data": np.zeros((1, 3072), np.uint8), "labels": [0]} for n in names}, "batches.meta", {})

    # Execute / Assert
    with pytest.raises(DatasetError, match="torchvision could not load"):
        load_dataset("cifar10", str(tmp_path))


# --------------------------------------------------------------------------- Tiny ImageNet


def test_tiny_imagenet_loads_a_stand_in_folder_with_sorted_wnids(tmp_path: Path, no_network: None):
    # Prepare: 3 classes created out of order, one grey-scale JPEG
    from PIL import Image

    colours = {"n03": (0, 0, 255), "n01": (255, 0, 0), "n02": (0, 255, 0)}
    for wnid, colour in colours.items():
        images = tmp_path / "tiny-imagenet-200" / "train" / wnid / "images"
        images.mkdir(parents=True)
        (images.parent / f"{wnid}_boxes.txt").write_text("not an image\n")
        for k in range(2):
            Image.new("RGB", (64, 64), colour).save(images / f"{wnid}_{k}.JPEG", quality=95)
    Image.new("L", (64, 64), 128).save(tmp_path / "tiny-imagenet-200" / "train" / "n02" / "images" / "n02_2.JPEG")

    # Execute
    ds = load_dataset("tiny_imagenet", str(tmp_path))

    # Assert
    assert ds.images.shape == (7, 3, 64, 64)
    assert ds.labels.tolist() == [0, 0, 1, 1, 1, 2, 2]
    assert ds.num_classes == 3
    channel_means = ds.images.reshape(7, 3, -1).mean(axis=2)
    assert channel_means[0].argmax() == 0 and channel_means[2].argmax() == 1 and channel_means[6].argmax() == 2
    np.testing.assert_allclose(channel_means[4], [128, 128, 128], atol=2)


def test_tiny_imagenet_missing_folder_names_the_expected_path(tmp_path: Path):
    # Execute / Assert
    with pytest.raises(DatasetError) as info:
        load_dataset("tiny_imagenet", str(tmp_path))
    assert str(tmp_path / "tiny-imagenet-200" / "train") in str(info.value)


# --------------------------------------------------------------------------- ArrayDataset, transforms


@pytest.mark.parametrize(
    ("images", "labels", "fragment"),
    [
        (np.zeros((2, 1, 4, 4), np.float32), np.zeros(2, np.int64), "uint8"),
        (np.zeros((2, 4, 4), np.uint8), np.zeros(2, np.int64), "shape"),
        (np.zeros((2, 1, 4, 4), np.uint8), np.zeros(2, np.int32), "int64"),
        (np.zeros((2, 1, 4, 4), np.uint8), np.zeros(3, np.int64), "3 labels"),
        (np.zeros((2, 1, 4, 4), np.uint8), np.array([0, 10]), "labels must lie"),
    ],
)
def test_array_dataset_rejects_malformed_arrays(images, labels, fragment):
    # Execute / Assert
    with pytest.raises(DatasetError, match=fragment):
        ArrayDataset("bad", images, labels, 10, (0.5,), (0.5,))


def test_normalize_batch_computes_x_over_255_minus_mean_over_std_per_channel():
    # Prepare
    x = np.random.default_rng(0).integers(0, 256, (4, 3, 5, 5), dtype=np.uint8)
    mean, std = (0.1, 0.5, 0.9), (0.2, 0.5, 1.0)

    # Execute
    out = normalize_batch(x, mean, std)

    # Assert: equal to the formula, and bit-identical to torchvision's ToTensor + Normalize
    from torchvision.transforms import functional as tf

    expected = (x / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    assert out.dtype == torch.float32 and tuple(out.shape) == x.shape
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-6)
    for image, row in zip(x, out, strict=True):
        reference = tf.normalize(tf.to_tensor(image.transpose(1, 2, 0)), list(mean), list(std))
        assert torch.equal(row, reference)


def test_normalize_batch_reads_read_only_arrays_without_warning_and_accepts_tensors():
    # Prepare
    x = np.full((2, 1, 3, 3), 255, dtype=np.uint8)
    x.setflags(write=False)

    # Execute
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_numpy = normalize_batch(x, (0.5,), (0.5,))
    from_tensor = normalize_batch(torch.from_numpy(x.copy()), (0.5,), (0.5,))

    # Assert
    assert torch.equal(from_numpy, torch.ones(2, 1, 3, 3))
    assert torch.equal(from_tensor, from_numpy)
