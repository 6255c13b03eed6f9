"""Real datasets from a user-named root: MNIST, Fashion-MNIST, EMNIST-Letters, CIFAR-10/100, Tiny ImageNet.

Following PFLlib's generators (``dataset/generate_*.py``), the official train and test
splits are merged into one pool (train first, then test) before partitioning, so MNIST
gives 70,000 samples and CIFAR 60,000; ``merge_splits=False`` keeps the train split
only. Tiny ImageNet uses the 100,000 images of its ``train/`` folder only, as PFLlib's
``generate_TinyImagenet.py`` does. Every dataset is normalised with mean = std = 0.5
per channel, PFLlib's ``transforms.Normalize``.

The files are read by torchvision's own dataset classes, so their format checks apply.
torchvision is imported lazily, inside the loaders. Nothing touches the network unless
``download=True``:

* MNIST-style datasets: torchvision only looks for the *decompressed* IDX files, so
  ``.gz`` files found in ``<root>/<Class>/raw/`` are decompressed here with ``gzip``,
  offline, before torchvision is called with ``download=False``. For EMNIST the
  ``.gz`` files may also sit in ``<root>/EMNIST/raw/gzip/`` or inside NIST's ``gzip.zip``
  (in ``<root>/EMNIST/raw/`` or ``<root>``), whose letters files are then extracted.
* CIFAR: a ``cifar-*-python.tar.gz`` archive found in ``root`` is extracted offline, refusing a member that
  would land outside ``root`` (:func:`rayfed.data.archives.extract_tar`).
* Anything still missing raises :class:`DatasetError` naming the files and the fix,
  unless ``download=True``, in which case torchvision downloads it.
"""

from __future__ import annotations

import functools
import gzip
import logging
import os
import shutil
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rayfed.data.archives import extract_tar
from rayfed.data.dataset import ArrayDataset
from rayfed.data.registry import DATASETS
from rayfed.util.errors import ConfigError, DatasetError
from rayfed.util.files import create_temp_file

__all__ = [
    "EMNIST_LETTERS_FILES",
    "load_cifar10",
    "load_cifar100",
    "load_emnist_letters",
    "load_fashion_mnist",
    "load_mnist",
    "load_tiny_imagenet",
    "require_root",
]

logger = logging.getLogger(__name__)

_HALF = 0.5  # PFLlib: transforms.Normalize([0.5], [0.5]) for every channel
_TINY_FOLDER = "tiny-imagenet-200"
_TINY_SIZE = 64
_IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
# torchvision.datasets.utils reads these errors as "bad or missing file".
_READ_ERRORS = (RuntimeError, AssertionError, ValueError, OSError, EOFError, KeyError)


# --------------------------------------------------------------------------- MNIST family


@DATASETS.register("mnist")
def load_mnist(root: str | None, *, download: bool = False, seed: int = 0, merge_splits: bool = True) -> ArrayDataset:
    """MNIST, 10 classes, 1x28x28: 70,000 samples merged (60,000 with ``merge_splits=False``)."""
    del seed
    return _load_idx("mnist", "MNIST", root, download, merge_splits)


@DATASETS.register("fashion_mnist")
def load_fashion_mnist(
    root: str | None, *, download: bool = False, seed: int = 0, merge_splits: bool = True
) -> ArrayDataset:
    """Fashion-MNIST, 10 classes, 1x28x28, from ``<root>/FashionMNIST/raw/``."""
    del seed
    return _load_idx("fashion_mnist", "FashionMNIST", root, download, merge_splits)


def _load_idx(name: str, class_name: str, root: str | None, download: bool, merge_splits: bool) -> ArrayDataset:
    base = require_root(name, root)
    import torchvision.datasets as tvd

    cls = getattr(tvd, class_name)
    raw = base / class_name / "raw"
    for archive, md5 in cls.resources:
        _gunzip_if_needed(name, raw / archive, md5)
    missing = [f"{class_name}/raw/{archive}" for archive, _ in cls.resources if not (raw / archive[:-3]).is_file()]
    fix = f"copy the files (the .gz files are enough) into {str(raw) + '/'!r}"
    splits = _load_splits(name, cls, base, missing, fix, download=download, merge_splits=merge_splits)
    images = np.concatenate([s.data.numpy() for s in splits])[:, None]  # (N, 1, 28, 28)
    labels = np.concatenate([s.targets.numpy() for s in splits]).astype(np.int64)
    return ArrayDataset(name, np.ascontiguousarray(images), labels, len(cls.classes), (_HALF,), (_HALF,))


def _gunzip_if_needed(name: str, archive: Path, md5: str | None, target: Path | None = None) -> None:
    """Decompress ``archive`` to ``target`` (default: next to itself), offline, unless ``target`` exists.

    Written to a temporary file first, then renamed, so an interrupted run never leaves
    a truncated IDX file that torchvision would accept as present. ``md5=None`` skips
    the checksum (torchvision lists none for EMNIST's single files).
    """
    target = target or archive.with_suffix("")
    if target.is_file() or not archive.is_file():
        return
    from torchvision.datasets.utils import check_md5

    fresh = (
        f"delete it and run again with data.download=true to fetch a fresh copy, or copy an intact "
        f"{archive.name} to {str(archive.parent) + '/'!r}"
    )
    if md5 is not None and not check_md5(archive, md5):
        raise DatasetError(
            f"dataset {name!r}: {str(archive)!r} is damaged (truncated, or another file): its MD5 checksum is not "
            f"torchvision's {md5}; {fresh}"
        )
    try:
        fd, tmp = create_temp_file(target)  # the user's umask, as the IDX files beside it
    except OSError as error:
        raise DatasetError(
            f"dataset {name!r}: cannot decompress {str(archive)!r} because {str(archive.parent)!r} "
            f"is not writable ({error}); copy the data root to a writable folder or gunzip the "
            "files there yourself"
        ) from error
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(archive, "rb") as src:
            shutil.copyfileobj(src, out, length=1 << 20)
        os.replace(tmp, target)
    except (OSError, EOFError) as error:
        Path(tmp).unlink(missing_ok=True)
        raise DatasetError(f"dataset {name!r}: {str(archive)!r} is not a valid gzip file ({error}); {fresh}") from error


# --------------------------------------------------------------------------- EMNIST-Letters

EMNIST_LETTERS_FILES = tuple(
    f"emnist-letters-{split}-{kind}"
    for split in ("train", "test")
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")
)
"""The four IDX files torchvision's ``EMNIST(split="letters")`` reads from ``<root>/EMNIST/raw/``."""
_EMNIST_LETTERS = 26


@DATASETS.register("emnist_letters")
def load_emnist_letters(
    root: str | None, *, download: bool = False, seed: int = 0, merge_splits: bool = True, na_class: bool = False
) -> ArrayDataset:
    """EMNIST Letters, 26 classes (a-z, upper and lower case together), 1x28x28: 145,600 samples
    merged (124,800 with ``merge_splits=False``), from ``<root>/EMNIST/raw/``.

    The files label the letters 1..26 (torchvision's class list puts "N/A" at 0, so code that
    sizes its output layer from that list, FedClassAvg's, gets 27 units of which class 0 never
    occurs). By default labels are shifted to 0..25 and the output layer has 26 units, as the
    FedClassAvg paper states; ``na_class=True`` keeps labels 1..26 and 27 classes, as its code
    does. Images are kept as the IDX files store them (transposed relative to upright letters),
    as torchvision reads them and PFLlib uses them.
    """
    del seed
    name = "emnist_letters"
    base = require_root(name, root)
    import torchvision.datasets as tvd

    raw = base / "EMNIST" / "raw"
    needed = EMNIST_LETTERS_FILES if merge_splits else EMNIST_LETTERS_FILES[:2]
    for idx_file in needed:
        _unpack_emnist_file(base, raw, idx_file)
    missing = [f"EMNIST/raw/{f}" for f in needed if not (raw / f).is_file()]
    fix = f"copy NIST's gzip.zip, or its emnist-letters-*.gz files, into {str(raw) + '/'!r}"
    cls = functools.partial(tvd.EMNIST, split="letters")
    splits = _load_splits(name, cls, base, missing, fix, download=download, merge_splits=merge_splits)
    images = np.concatenate([s.data.numpy() for s in splits])[:, None]  # (N, 1, 28, 28)
    labels = np.concatenate([s.targets.numpy() for s in splits]).astype(np.int64)
    if len(labels) and (labels.min() < 1 or labels.max() > _EMNIST_LETTERS):
        raise DatasetError(
            f"dataset {name!r}: EMNIST letters labels must lie in 1..{_EMNIST_LETTERS}, but the files under "
            f"{str(raw)!r} hold labels {labels.min()}..{labels.max()}; are they the letters split?"
        )
    if not na_class:
        labels -= 1
    classes = _EMNIST_LETTERS + (1 if na_class else 0)
    return ArrayDataset(name, np.ascontiguousarray(images), labels, classes, (_HALF,), (_HALF,))


def _unpack_emnist_file(base: Path, raw: Path, idx_file: str) -> None:
    """Make ``raw/idx_file`` from its ``.gz`` in ``raw/`` or ``raw/gzip/``, or from a ``gzip.zip`` archive."""
    if (raw / idx_file).is_file():
        return
    archive = next((p for p in (raw / f"{idx_file}.gz", raw / "gzip" / f"{idx_file}.gz") if p.is_file()), None)
    if archive is None:
        archive = _extract_from_zip("emnist_letters", [raw / "gzip.zip", base / "gzip.zip"], f"gzip/{idx_file}.gz", raw)
    if archive is not None:
        _gunzip_if_needed("emnist_letters", archive, None, raw / idx_file)


def _extract_from_zip(name: str, zips: list[Path], member: str, into: Path) -> Path | None:
    """Extract ``member`` from the first of ``zips`` that holds it into ``into``; its path, or None."""
    for path in zips:
        if not path.is_file():
            continue
        try:
            with zipfile.ZipFile(path) as archive:
                if member not in archive.namelist():
                    continue
                logger.info("%s: extracting %s from %s offline", name, member, path)
                return Path(archive.extract(member, into))
        except (OSError, zipfile.BadZipFile) as error:
            raise DatasetError(f"dataset {name!r}: cannot read {str(path)!r} ({error})") from error
    return None


# --------------------------------------------------------------------------- CIFAR


@DATASETS.register("cifar10")
def load_cifar10(root: str | None, *, download: bool = False, seed: int = 0, merge_splits: bool = True) -> ArrayDataset:
    """CIFAR-10, 10 classes, 3x32x32: 60,000 samples merged, from ``<root>/cifar-10-batches-py/``."""
    del seed
    return _load_cifar("cifar10", "CIFAR10", root, download, merge_splits)


@DATASETS.register("cifar100")
def load_cifar100(
    root: str | None, *, download: bool = False, seed: int = 0, merge_splits: bool = True
) -> ArrayDataset:
    """CIFAR-100 (fine labels), 100 classes, 3x32x32, from ``<root>/cifar-100-python/``."""
    del seed
    return _load_cifar("cifar100", "CIFAR100", root, download, merge_splits)


def _load_cifar(name: str, class_name: str, root: str | None, download: bool, merge_splits: bool) -> ArrayDataset:
    base = require_root(name, root)
    import torchvision.datasets as tvd

    cls = getattr(tvd, class_name)
    folder = base / cls.base_folder
    # torchvision checks every batch file (train and test) even to load one split.
    needed = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]

    def missing() -> list[str]:
        return [f"{cls.base_folder}/{f}" for f in needed if not (folder / f).is_file()]

    if missing() and (base / cls.filename).is_file():
        extract_tar(name, base / cls.filename, base)
    fix = f"put {cls.filename} (or its extracted {cls.base_folder}/ folder) into {str(base)!r}"
    splits = _load_splits(name, cls, base, missing(), fix, download=download, merge_splits=merge_splits)
    images = np.concatenate([s.data for s in splits]).transpose(0, 3, 1, 2)  # NHWC -> NCHW
    labels = np.concatenate([np.asarray(s.targets, dtype=np.int64) for s in splits])
    return ArrayDataset(name, np.ascontiguousarray(images), labels, len(splits[0].classes), (_HALF,) * 3, (_HALF,) * 3)


def _load_splits(
    name: str, cls: Any, base: Path, missing: list[str], fix: str, *, download: bool, merge_splits: bool
) -> list[Any]:
    """Load the train split (and the test split when merging) with torchvision.

    Files still ``missing`` raise DatasetError listing them with ``fix``, unless
    ``download`` lets torchvision fetch them.
    """
    if missing and not download:
        raise DatasetError(
            f"dataset {name!r}: files missing under root {str(base)!r}: {', '.join(missing)}. "
            f"Fix: set data.download=true to let torchvision download them, or {fix}"
        )
    splits = [_torchvision_split(name, cls, base, train=True, download=download)]
    if merge_splits:
        splits.append(_torchvision_split(name, cls, base, train=False, download=download))
    return splits


def _torchvision_split(name: str, cls: Any, base: Path, *, train: bool, download: bool) -> Any:
    """Instantiate a torchvision dataset, turning its errors into DatasetError."""
    try:
        return cls(str(base), train=train, download=download)
    except _READ_ERRORS as error:
        raise DatasetError(
            f"dataset {name!r}: torchvision could not load the {'train' if train else 'test'} split "
            f"from root {str(base)!r}: {error}"
            + ("" if download else " (set data.download=true to fetch fresh copies)")
        ) from error


# --------------------------------------------------------------------------- Tiny ImageNet


@DATASETS.register("tiny_imagenet")
def load_tiny_imagenet(root: str | None, *, download: bool = False, seed: int = 0) -> ArrayDataset:
    """Tiny ImageNet's 100,000 training images, 200 classes, 3x64x64.

    Reads ``<root>/tiny-imagenet-200/train/<wnid>/images/*.JPEG``; classes are the
    sorted wnids and files are sorted by name within a class, the order of torchvision's
    ``ImageFolder`` that PFLlib's ``generate_TinyImagenet.py`` uses. Grey-scale JPEGs
    (a few hundred in the set) are converted to RGB. Decoding runs on a thread pool
    (PIL releases the GIL while decoding) into one preallocated uint8 array.
    """
    del seed
    base = require_root("tiny_imagenet", root)
    train = base / _TINY_FOLDER / "train"
    if not train.is_dir():
        raise DatasetError(
            f"dataset 'tiny_imagenet': folder {str(train)!r} not found. torchvision cannot "
            f"download Tiny ImageNet{' (data.download=true does not help)' if download else ''}; "
            f"download tiny-imagenet-200.zip (http://cs231n.stanford.edu/tiny-imagenet-200.zip) "
            f"and unzip it into {str(base)!r}"
        )
    wnids = sorted(d.name for d in train.iterdir() if d.is_dir())
    files: list[Path] = []
    counts = []
    for wnid in wnids:
        images = train / wnid / "images"
        found = (
            sorted((p for p in images.iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES), key=lambda p: p.name)
            if images.is_dir()
            else []
        )
        files.extend(found)
        counts.append(len(found))
    if not files:
        raise DatasetError(f"dataset 'tiny_imagenet': no images found under {str(train) + '/<wnid>/images/'!r}")
    out = np.empty((len(files), 3, _TINY_SIZE, _TINY_SIZE), dtype=np.uint8)
    _decode_into(files, out)
    labels = np.repeat(np.arange(len(wnids), dtype=np.int64), counts)
    return ArrayDataset("tiny_imagenet", out, labels, len(wnids), (_HALF,) * 3, (_HALF,) * 3)


def _decode_into(files: list[Path], out: np.ndarray) -> None:
    """Decode ``files`` with PIL into ``out[i]`` (C, H, W), in parallel over chunks."""
    from PIL import Image

    def decode(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            try:
                with Image.open(files[i]) as image:
                    array = np.asarray(image.convert("RGB"))
            except OSError as error:
                raise DatasetError(f"dataset 'tiny_imagenet': cannot decode {str(files[i])!r} ({error})") from error
            if array.shape != (_TINY_SIZE, _TINY_SIZE, 3):
                raise DatasetError(
                    f"dataset 'tiny_imagenet': {str(files[i])!r} is {array.shape[1]}x{array.shape[0]}, "
                    f"expected {_TINY_SIZE}x{_TINY_SIZE}"
                )
            out[i] = array.transpose(2, 0, 1)

    chunk = 512
    workers = min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(decode, lo, min(lo + chunk, len(files))) for lo in range(0, len(files), chunk)]
        for future in futures:
            future.result()


def require_root(name: str, root: str | None) -> Path:
    if root is None or str(root) == "":
        raise ConfigError(f"dataset {name!r} needs a data folder, but data.root is not set; set data.root=<folder>")
    base = Path(root).expanduser()
    if base.exists() and not base.is_dir():
        raise ConfigError(
            f"data.root must be a folder, but got data.root={str(root)!r}, which is a file; set data.root to the "
            f"folder that holds dataset {name!r} (or that it may be downloaded into with data.download=true)"
        )
    return base
