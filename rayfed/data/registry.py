"""Dataset registry: configs name a dataset, ``load_dataset`` finds and calls its loader.

A loader is a plain function ``loader(root, *, download, seed, **options) -> ArrayDataset``
registered with ``@DATASETS.register("name")``. Its keyword-only parameters other than
``download`` and ``seed`` are the options a config may set (``data.options``), so the
list of allowed options lives in one place, the loader's signature. Loading is logged
(level INFO: what is loaded, then how many samples and how long it took).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from rayfed.data.dataset import ArrayDataset
from rayfed.util.errors import ConfigError
from rayfed.util.registry import Registry

logger = logging.getLogger(__name__)

__all__ = ["DATASETS", "DatasetLoader", "check_dataset_options", "dataset_options", "load_dataset"]

DatasetLoader = Callable[..., ArrayDataset]
"""``loader(root: str | None, *, download: bool, seed: int, **options) -> ArrayDataset``."""

DATASETS: Registry[DatasetLoader] = Registry("dataset", field="data.dataset")

_COMMON = ("download", "seed")


def dataset_options(name: str) -> dict[str, Any]:
    """The options dataset ``name`` accepts, with their defaults.

    >>> dataset_options("synthetic")["num_classes"]
    10
    """
    loader = DATASETS.get(name)
    return {
        p.name: p.default
        for p in inspect.signature(loader).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in _COMMON
    }


def check_dataset_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as a dict, if dataset ``name`` takes every one of them; else a ConfigError listing those it takes."""
    allowed = dataset_options(name)
    for key in options:
        if key not in allowed:
            raise ConfigError(
                f"unknown option data.options.{key} for dataset {name!r}; allowed options: "
                f"{', '.join(sorted(allowed)) or '(none)'}"
            )
    return dict(options)


def load_dataset(
    name: str,
    root: str | None,
    *,
    download: bool = False,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
) -> ArrayDataset:
    """Load the dataset registered as ``name``.

    Parameters
    ----------
    name
        Registry name (``data.dataset``), e.g. ``"synthetic"`` or ``"mnist"``.
    root
        Folder holding the files (``data.root``); ignored by generated datasets.
    download
        Allow torchvision to download missing files (``data.download``).
    seed
        Seed for generated datasets; real datasets ignore it.
    options
        Dataset-specific options (``data.options``), checked against the loader's
        keyword-only parameters.

    Raises
    ------
    ConfigError
        For an unknown name (listing the known ones) or an unknown option (listing the
        allowed ones).
    DatasetError
        When the files are missing or unreadable.

    Examples
    --------
    >>> ds = load_dataset("synthetic", None, options={"num_samples": 100})
    >>> len(ds), ds.input_shape
    (100, (1, 28, 28))
    """
    loader = DATASETS.get(name)
    options = check_dataset_options(name, options or {})
    started = time.perf_counter()
    logger.info("loading dataset %r%s", name, f" with {options}" if options else "")
    dataset = loader(root, download=download, seed=seed, **options)
    logger.info("loaded dataset %r: %d samples in %.1f s", name, len(dataset), time.perf_counter() - started)
    return dataset
