"""``rayfed list`` reads a cached catalogue that always matches the live registries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rayfed.algorithms import ALGORITHMS
from rayfed.config import catalogue as catalogue_module
from rayfed.config.catalogue import catalogue, params_reference
from rayfed.data import DATASETS
from rayfed.models import MODELS


def test_catalogue_matches_the_live_registries(tmp_path: Path) -> None:
    # Act: once built, once read from the cache.
    built, cached = catalogue(tmp_path), catalogue(tmp_path)
    # Assert
    for listing in (built, cached):
        assert list(listing.algorithms) == ALGORITHMS.shipped()
        assert listing.params["fedprox"] == params_reference(ALGORITHMS.get("fedprox"))
        assert listing.datasets == DATASETS.shipped() and listing.models == MODELS.shipped()


def test_a_fresh_cache_is_read_without_importing_the_registries(tmp_path: Path, monkeypatch) -> None:
    # Arrange: a cache written by a first call.
    first = catalogue(tmp_path)
    monkeypatch.setattr(catalogue_module, "_from_registries", lambda: pytest.fail("registries imported"))
    # Act / Assert
    assert catalogue(tmp_path) == first


def test_a_changed_source_tree_or_damaged_cache_rebuilds(tmp_path: Path, monkeypatch) -> None:
    # Arrange: a cache, then a different fingerprint (an edited package), then garbage in the file.
    catalogue(tmp_path)
    calls: list[int] = []
    real = catalogue_module._from_registries
    monkeypatch.setattr(catalogue_module, "_from_registries", lambda: calls.append(1) or real())
    monkeypatch.setattr(catalogue_module, "source_fingerprint", lambda: "edited")
    # Act
    catalogue(tmp_path)
    (cache_file,) = tmp_path.glob("catalogue-*.json")
    assert json.loads(cache_file.read_text())["fingerprint"] == "edited"
    cache_file.write_text("{not json")
    listing = catalogue(tmp_path)
    # Assert: rebuilt both times, and still right.
    assert len(calls) == 2 and "fedavg" in listing.algorithms


def test_an_unwritable_cache_only_costs_time(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert "fedavg" in catalogue(blocker / "cache").algorithms


def test_rayfed_list_answers_quickly_once_cached(tmp_path: Path) -> None:
    """Under 1.5 s on the 2-core box (torch is not imported): the fastest of three answers, as the shared box's
    load can slow any one of them."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    command = [sys.executable, "-m", "rayfed", "list"]
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)  # builds the cache
    script = "import sys; from rayfed.cli import main; main(['list']); print('torch' in sys.modules)"
    times = []
    for _ in range(3):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        assert done.stdout.strip().endswith("False"), "rayfed list imported torch"
        assert "fedavg" in done.stdout
    assert min(times) < 1.5, times
