"""PFLlib-format datasets: the per-client files PFLlib's generators write, trained on exactly as given.

PFLlib (github.com/TsingZ0/PFLlib, ``dataset/utils/dataset_utils.py``, ``save_file``), and the
cwFedAvg authors' code built on it, keep a partitioned dataset as one folder::

    config.json            {"num_clients": M, "num_classes": K, ...}
    train/0.npz ... train/<M-1>.npz
    test/0.npz  ... test/<M-1>.npz

Each ``.npz`` holds one member, ``data``: a dict ``{"x": images, "y": labels}`` that numpy
stored as a pickled object array; the images are the generator's normalised float32
(torchvision ``ToTensor`` then ``Normalize(mean, std)``, 0.5 and 0.5 in every generator of
the cwFedAvg papers' datasets), the labels int64.

``data.dataset="pfllib"`` reads such a folder (``data.root``) into one pool, every client's
training file in client order, then every test file; ``data.partition="pfllib"`` gives
client i exactly the rows of its own two files, in the files' order. The images are kept
as uint8, as every rayfed dataset is: each float is mapped back to the byte it was made
from, and the loader checks that normalising the bytes again gives the files' floats bit
for bit (:func:`rayfed.data.transforms.normalize_batch` is the generator's transform), so
the models see the very inputs PFLlib's clients see.

The pickles are read by an unpickler that builds numpy arrays and nothing else: a file
that asks for any other object is refused, not run.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rayfed.data.dataset import ArrayDataset
from rayfed.data.partition import Partition
from rayfed.data.partitioners import PARTITIONERS
from rayfed.data.registry import DATASETS
from rayfed.data.settings import PFLLIB
from rayfed.util.errors import ConfigError, DatasetError

if TYPE_CHECKING:
    from rayfed.data.settings import DataConfig

logger = logging.getLogger(__name__)

__all__ = ["PFLLIB", "PfllibFolder", "read_folder", "load_pfllib"]
"""The name of the dataset and of the partition that read a PFLlib folder; one needs the other."""
GENERATORS_STATISTIC = 0.5
"""The mean and std the PFLlib generators of the cwFedAvg papers' datasets normalise with (``Normalize(0.5, 0.5)``)."""

_ALLOWED_GLOBALS = {
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}
"""What numpy's pickle of a dict of arrays refers to (numpy >= 2 writes ``numpy._core``, older ``numpy.core``)."""


class _ArraysOnly(pickle.Unpickler):
    """An unpickler that builds numpy arrays, dicts, lists and plain values, and refuses any other object."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a PFLlib file holds numpy arrays only")
        return super().find_class(module, name)


def _read_split_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of one client's ``train/<i>.npz`` or ``test/<i>.npz``."""
    try:
        with zipfile.ZipFile(path) as archive:
            raw = archive.read("data.npy")
        stream = io.BytesIO(raw)
        version = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(stream)
        if dtype != np.dtype(object) or shape != ():
            raise DatasetError(f"member data.npy holds a {dtype} array of shape {shape}, not a pickled dict")
        content = _ArraysOnly(stream).load()  # np.save pickles the whole 0-d object array
        content = content.item() if isinstance(content, np.ndarray) and content.shape == () else content
    except DatasetError as error:
        raise DatasetError(f"PFLlib file {str(path)!r}: {error}") from None
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError) as error:
        raise DatasetError(
            f"PFLlib file {str(path)!r} is not a file PFLlib's generator writes (an .npz whose member 'data' "
            f"is a dict of arrays 'x' and 'y'): {type(error).__name__}: {error}"
        ) from error
    if not isinstance(content, dict) or not {"x", "y"} <= set(content):
        raise DatasetError(f"PFLlib file {str(path)!r} holds {type(content).__name__}, not a dict with 'x' and 'y'")
    x, y = np.asarray(content["x"]), np.asarray(content["y"])
    if x.ndim != 4 or len(x) != len(y) or y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DatasetError(
            f"PFLlib file {str(path)!r}: expected images x of shape (n, C, H, W) and n integer labels y, but got "
            f"x {x.dtype} {x.shape} and y {y.dtype} {y.shape} (only image datasets are supported)"
        )
    return x, y.astype(np.int64)


def _to_bytes(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...], where: str) -> np.ndarray:
    """The uint8 images whose normalisation with ``mean``, ``std`` gives exactly ``x`` (uint8 ``x`` as is)."""
    if x.dtype == np.uint8:
        return np.ascontiguousarray(x)
    scale = np.asarray(std, np.float64)[None, :, None, None]
    shift = np.asarray(mean, np.float64)[None, :, None, None]
    images = np.clip(np.rint((x.astype(np.float64) * scale + shift) * 255.0), 0, 255).astype(np.uint8)
    images = np.ascontiguousarray(images)
    from rayfed.data.transforms import normalize_batch  # torch, only for a folder of floats

    if not np.array_equal(normalize_batch(images, mean, std).numpy(), x.astype(np.float32)):
        raise DatasetError(
            f"the images of {where} are not (x / 255 - mean) / std of any bytes with data.options.mean={list(mean)} "
            f"and data.options.std={list(std)}; set the mean and std the generator normalised with"
        )
    return images


@dataclass(frozen=True, eq=False)
class PfllibFolder:
    """A PFLlib folder read into one pool: every client's training rows in client order, then every test row."""

    dataset: ArrayDataset
    train_sizes: np.ndarray
    """int64 (M,): rows of each client's ``train/<i>.npz``."""
    test_sizes: np.ndarray
    """int64 (M,): rows of each client's ``test/<i>.npz``."""

    @property
    def num_clients(self) -> int:
        return len(self.train_sizes)

    def partition(self) -> Partition:
        """Client i trains on the rows of its own training file and tests on those of its test file, in file order."""
        train_offsets = np.concatenate([[0], np.cumsum(self.train_sizes)]).astype(np.int64)
        test_offsets = np.concatenate([[0], np.cumsum(self.test_sizes)]).astype(np.int64)
        train_indices = np.arange(train_offsets[-1], dtype=np.int64)
        test_indices = train_offsets[-1] + np.arange(test_offsets[-1], dtype=np.int64)
        labels = self.dataset.labels
        return Partition.from_csr(
            train_indices, train_offsets, test_indices, test_offsets, labels, self.dataset.num_classes
        )


def _channel_values(name: str, value: float | list[float] | tuple[float, ...], channels: int) -> tuple[float, ...]:
    """``data.options.<name>`` as one float per channel: a single number stands for every channel."""
    values = (value,) * channels if isinstance(value, (int, float)) else tuple(value)
    if len(values) != channels or not all(isinstance(v, (int, float)) for v in values):
        raise ConfigError(
            f"data.options.{name} must be a number or {channels} numbers (one per channel), but got "
            f"data.options.{name}={value!r}"
        )
    return tuple(float(v) for v in values)


def _folder_root(root: str | None) -> Path:
    if root is None:
        raise ConfigError(
            "data.root=None: data.dataset='pfllib' reads the folder a PFLlib generator wrote (config.json, train/, "
            "test/); set data.root to that folder"
        )
    path = Path(root).expanduser()
    if not (path / "config.json").is_file():
        raise DatasetError(
            f"data.root={str(root)!r} holds no config.json: data.dataset='pfllib' reads the folder a PFLlib "
            "generator wrote (config.json, train/<i>.npz, test/<i>.npz); set data.root to that folder"
        )
    return path.resolve()


def read_folder(root: str | None, mean: Any = GENERATORS_STATISTIC, std: Any = GENERATORS_STATISTIC) -> PfllibFolder:
    """The PFLlib folder ``root`` (``data.root``) as one pool and its clients' file sizes.

    The last folder read is kept (same path, same files), so the dataset loader and the
    partitioner read the files once.
    """
    path = _folder_root(root)
    files = sorted(p for p in path.glob("t*/*.npz"))
    signature = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in [path / "config.json", *files])
    return _read_folder(path, signature, _frozen(mean), _frozen(std))


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@functools.lru_cache(maxsize=1)
def _read_folder(path: Path, signature: tuple[Any, ...], mean: Any, std: Any) -> PfllibFolder:
    del signature  # part of the cache key only: changed files are read again
    try:
        config = json.loads((path / "config.json").read_text())
        num_clients, num_classes = int(config["num_clients"]), int(config["num_classes"])
    except (ValueError, KeyError, TypeError) as error:
        raise DatasetError(
            f"{str(path / 'config.json')!r} does not give num_clients and num_classes as PFLlib's save_file writes "
            f"them: {type(error).__name__}: {error}"
        ) from error
    splits = {}
    for split in ("train", "test"):
        missing = [i for i in range(num_clients) if not (path / split / f"{i}.npz").is_file()]
        if missing:
            raise DatasetError(
                f"PFLlib folder {str(path)!r}: config.json gives num_clients={num_clients}, but {split}/ lacks "
                f"{', '.join(f'{i}.npz' for i in missing[:5])}{' ...' if len(missing) > 5 else ''}"
            )
        extra = sorted({p.name for p in (path / split).glob("*.npz")} - {f"{i}.npz" for i in range(num_clients)})
        if extra:
            logger.warning(
                "PFLlib folder %r: %s/ also holds %s, which config.json's num_clients=%d leaves out; they are not read",
                str(path),
                split,
                ", ".join(extra[:5]) + (" ..." if len(extra) > 5 else ""),
                num_clients,
            )
        splits[split] = [_read_split_file(path / split / f"{i}.npz") for i in range(num_clients)]
        for i, (_, y) in enumerate(splits[split]):
            outside = y[(y < 0) | (y >= num_classes)]
            if outside.size:
                raise DatasetError(
                    f"PFLlib file {str(path / split / f'{i}.npz')!r} holds label {int(outside[0])}, outside the "
                    f"num_classes={num_classes} classes config.json gives (labels 0 to {num_classes - 1}); fix "
                    "num_classes in config.json or regenerate the folder"
                )
    pieces = splits["train"] + splits["test"]
    names = [f"{split}/{i}.npz" for split in ("train", "test") for i in range(num_clients)]
    first_of_shape: dict[tuple[int, ...], str] = {}
    for name, (x, _) in zip(names, pieces):
        if len(x):
            first_of_shape.setdefault(tuple(x.shape[1:]), name)
    if len(first_of_shape) > 1:
        seen = "; ".join(f"{shape} in {name}" for shape, name in first_of_shape.items())
        raise DatasetError(
            f"PFLlib folder {str(path)!r} mixes images of shapes {seen}; every file of a folder holds images of one "
            "shape"
        )
    channels = next(iter(first_of_shape))[0] if first_of_shape else 1
    mean_c, std_c = _channel_values("mean", mean, channels), _channel_values("std", std, channels)
    images = np.concatenate([_to_bytes(x, mean_c, std_c, f"{str(path)!r}") for x, _ in pieces])
    labels = np.concatenate([y for _, y in pieces])
    dataset = ArrayDataset(PFLLIB, np.ascontiguousarray(images), labels, num_classes, mean_c, std_c)
    sizes = {split: np.array([len(y) for _, y in splits[split]], dtype=np.int64) for split in splits}
    return PfllibFolder(dataset, sizes["train"], sizes["test"])


@DATASETS.register(PFLLIB)
def load_pfllib(
    root: str | None,
    *,
    download: bool = False,
    seed: int = 0,
    mean: float | list[float] = GENERATORS_STATISTIC,
    std: float | list[float] = GENERATORS_STATISTIC,
) -> ArrayDataset:
    """The images of a folder written by a PFLlib generator (``data.root``), with ``data.partition="pfllib"``.

    ``mean`` and ``std`` are those the generator normalised with (one number for every channel, or
    one per channel); the files' floats are mapped back to bytes and checked against them.
    """
    del download, seed  # the files are the data: nothing to download, nothing drawn
    return read_folder(root, mean, std).dataset


@PARTITIONERS.register(PFLLIB)
def _pfllib_partitioner(
    labels: np.ndarray, num_classes: int, data: DataConfig, rng: np.random.RandomState
) -> Partition:
    """``data.partition="pfllib"``: each client's own PFLlib train and test files (module docstring)."""
    del rng, num_classes  # nothing is drawn: the folder is the partition
    options = data.options
    folder = read_folder(data.root, options.get("mean", GENERATORS_STATISTIC), options.get("std", GENERATORS_STATISTIC))
    if len(labels) != len(folder.dataset):
        raise ConfigError(
            f"data.partition='pfllib' gives each client its own files of the whole folder {data.root!r} "
            f"({len(folder.dataset)} samples), but was asked to partition {len(labels)}: an algorithm that holds "
            "server data out of the pool cannot run on it; choose another algorithm or dataset"
        )
    if data.num_clients != folder.num_clients:
        raise ConfigError(
            f"data.num_clients={data.num_clients}, but the PFLlib folder {data.root!r} holds "
            f"{folder.num_clients} clients (its config.json); set data.num_clients={folder.num_clients}"
        )
    return folder.partition()
