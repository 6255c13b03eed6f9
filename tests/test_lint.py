"""The code passes the project's linter (``[tool.ruff]`` in pyproject.toml) everywhere it lives."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing_in_the_package_tests_benchmarks_and_examples() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is part of the test extra: pip install -e '.[test]'"
    done = subprocess.run([ruff, "check", "rayfed", "tests", "benchmarks", "examples"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
