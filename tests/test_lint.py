"""The code passes the project's linter and is laid out by its formatter (``[tool.ruff]`` in pyproject.toml)
everywhere it lives."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


PLACES = ("rayfed", "tests", "benchmarks", "examples")


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is part of the test extra: pip install -e '.[test]'"
    return subprocess.run([ruff, *args, *PLACES], cwd=REPO, capture_output=True, text=True)


def test_ruff_finds_nothing_in_the_package_tests_benchmarks_and_examples() -> None:
    done = _ruff("check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_would_change_nothing() -> None:
    done = _ruff("format", "--check")
    assert done.returncode == 0, f"run `ruff format {' '.join(PLACES)}`:\n{done.stdout}{done.stderr}"
