"""How long the answers take that rayfed promises in seconds, timed here rather than in the tests.

The tests check what makes these answers quick by counting (the imports of a cached ``rayfed list``, the Python
calls of a partition, the datasets loaded before a refusal), as a clock on a shared box cannot be trusted; this
script times them, each the fastest of ``--repeats`` tries (the box's load only ever slows one down):

* ``list_s``: ``rayfed list`` once its catalogue is cached, a fresh process (promise: under 1.5 s);
* ``iid_s``, ``dirichlet_s``: 100,000 clients partitioned over 1,000,000 labels of 100 classes (under 15 s);
* ``slices_s``: 1,000,000 clients of 15 samples on a pool of 150,000 (``data.partition=slices``; under 20 s);
* ``refusal_s``: a run whose dataset (10^9 synthetic samples) cannot fit in memory, refused from the estimate
  before anything is generated or written (under 10 s).

    python benchmarks/quick_answers.py [--repeats 3]

The last line: ``list_s=<s> iid_s=<s> dirichlet_s=<s> slices_s=<s> refusal_s=<s> kept=<promises kept>/5``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rayfed import ResourceError, RunConfig, run
from rayfed.config import DataConfig
from rayfed.data import make_partition

PROMISES = {"list_s": 1.5, "iid_s": 15.0, "dirichlet_s": 15.0, "slices_s": 20.0, "refusal_s": 10.0}
"""Seconds each answer is promised within, on the 2-core box."""


def fastest(repeats: int, work: Callable[[], object]) -> float:
    """The shortest wall-clock time of ``repeats`` calls of ``work``."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def rayfed_list(cache: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    subprocess.run([sys.executable, "-m", "rayfed", "list"], env=env, check=True, capture_output=True)


def partition(labels: np.ndarray, num_classes: int, **fields: object) -> None:
    make_partition(labels, num_classes, DataConfig(**fields))


def refused(run_dir: Path) -> None:
    big = {"data.options": {"num_samples": 10**9}, "engine.backend": "local", "run_dir": str(run_dir)}
    try:
        run(RunConfig().override(big))
    except ResourceError:
        return
    raise AssertionError("a run of 10^9 samples was not refused")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="tries of each answer; the fastest counts")
    args = parser.parse_args()
    labels = np.random.default_rng(0).integers(0, 100, 1_000_000).astype(np.int64)
    pool = np.random.default_rng(0).integers(0, 10, 150_000)
    with tempfile.TemporaryDirectory(prefix="rayfed-quick-") as folder:
        cache = Path(folder) / "cache"
        rayfed_list(cache)  # builds the catalogue's cache
        seconds = {
            "list_s": fastest(args.repeats, lambda: rayfed_list(cache)),
            "iid_s": fastest(
                args.repeats, lambda: partition(labels, 100, partition="iid", num_clients=100_000, min_samples=0)
            ),
            "dirichlet_s": fastest(
                args.repeats, lambda: partition(labels, 100, partition="dirichlet", num_clients=100_000, min_samples=0)
            ),
            "slices_s": fastest(
                args.repeats,
                lambda: partition(pool, 10, partition="slices", num_clients=1_000_000, samples_per_client=15, seed=1),
            ),
            "refusal_s": fastest(args.repeats, lambda: refused(Path(folder) / "run")),
        }
    for name, value in seconds.items():
        print(f"{name:12s} {value:7.2f} s   (promised under {PROMISES[name]:g} s)")
    kept = sum(seconds[name] < limit for name, limit in PROMISES.items())
    print(" ".join(f"{name}={value:.2f}" for name, value in seconds.items()) + f" kept={kept}/{len(PROMISES)}")


if __name__ == "__main__":
    main()
