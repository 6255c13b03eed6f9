"""The tests' synthetic dataset, generated once per process for each set of options.

About 200 tests run tiny runs on the same 1,200 synthetic samples; :func:`cache_synthetic` registers, in place
of rayfed's loader for ``data.dataset="synthetic"``, one that generates each set of options once and hands out
that dataset after. Its arrays are read-only, so that no test can change what the next one reads (a run's
workers get them read-only from Ray's object store as it is). Tests of the generator itself call
:func:`rayfed.data.make_synthetic`, which is not cached.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from rayfed.data import DATASETS, ArrayDataset, synthetic

__all__ = ["CACHED_BYTES", "cache_synthetic"]

CACHED_BYTES = 8 << 20
"""The largest dataset kept (a tiny run's 1,200 samples take 1 MB); larger ones, such as those a memory test
measures, are generated on every load."""


@functools.cache
def cache_synthetic() -> None:
    """Register the caching loader (once per process, however often it is called)."""
    load = synthetic.load_synthetic  # the generator's registry entry itself
    signature = inspect.signature(load)

    @functools.lru_cache(maxsize=16)
    def generated(options: tuple[tuple[str, Any], ...]) -> ArrayDataset:
        dataset = load(None, **dict(options))
        for array in (dataset.inputs, dataset.labels):
            array.flags.writeable = False
        return dataset

    @functools.wraps(load)  # the same signature, so the same options are allowed
    def cached(root: str | None, **given: Any) -> ArrayDataset:
        bound = signature.bind(root, **given)
        bound.apply_defaults()
        options = {name: value for name, value in bound.arguments.items() if name not in ("root", "download")}
        if not all(type(value) is int for value in options.values()):
            return load(root, **given)  # which refuses them, naming the option
        size = options["num_samples"] * options["channels"] * options["image_size"] ** 2
        return generated(tuple(sorted(options.items()))) if size <= CACHED_BYTES else load(root, **given)

    DATASETS.register("synthetic", origin=DATASETS.origin("synthetic"))(cached)
