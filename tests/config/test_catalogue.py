"""``rayfed list`` reads a cached catalogue that always matches the live registries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


HEAVY = ("torch", "torchvision", "ray", "optuna", "mlflow", "pandas", "matplotlib")
"""Packages whose import takes seconds; once cached, ``rayfed list`` answers without them."""


def test_rayfed_list_answers_from_its_cache_without_heavy_imports_or_the_registries(tmp_path: Path) -> None:
    """What keeps the answer quick, counted: once the cache is built, ``rayfed list`` imports none of the heavy
    packages and no module that registers a method or a model. How quick it is, is timed by
    ``benchmarks/quick_answers.py``."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "rayfed", "list"], env=env, check=True, capture_output=True, timeout=120)
    script = "import json, sys; from rayfed.cli import main; main(['list']); print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True)
    *listing, last = done.stdout.splitlines()
    imported = set(json.loads(last))
    registering = {registry.origin(name) for registry in (ALGORITHMS, MODELS) for name in registry.shipped()}
    assert "fedavg" in "\n".join(listing)
    assert sorted(name for name in imported if name.split(".")[0] in HEAVY) == []
    assert sorted(registering & imported) == []
    assert len(registering) > 10  # the check above looks at every method's and model's module
