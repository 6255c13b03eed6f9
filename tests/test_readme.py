"""The README's cheap commands and snippets run verbatim on this checkout.

A block that follows the comment ``<!-- readme-test -->`` is run as written, in a fresh folder, with the
environment's programs first on PATH (as ``source .venv/bin/activate`` puts them): a Python block as one
script, a shell block line by line, each line as one command that must succeed. The set-up commands (an
install and the whole suite) are what ``.ci/run`` runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "<!-- readme-test -->"


def marked_blocks() -> list[tuple[str, str]]:
    """(language, code) of every block the README marks as tested."""
    pattern = re.escape(MARKER) + r"\s*```(\w+)\n(.*?)```"
    return re.findall(pattern, README.read_text(encoding="utf-8"), flags=re.DOTALL)


def run_verbatim(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_readme_states_the_number_of_tests_the_suite_collects(request: pytest.FixtureRequest) -> None:
    """Within a tenth, so that adding a few tests needs no edit, and a stale figure fails the whole suite's run."""
    config = request.config
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword
    if not whole or config.option.markexpr or config.option.deselect or getattr(config.option, "lf", False):
        pytest.skip("counts the tests of the whole suite, run as the README's command runs it")
    (stated,) = re.findall(r"The suite holds ([\d,]+) tests", README.read_text(encoding="utf-8"))
    collected = len(request.session.items)
    assert abs(collected - int(stated.replace(",", ""))) <= collected / 10, (
        f"the README states {stated} tests, the suite collects {collected}: measure the suite again and update it"
    )


def test_the_readme_marks_its_cheap_blocks() -> None:
    assert [language for language, _ in marked_blocks()] == ["python", "bash"]


@pytest.mark.parametrize("index", range(2))
def test_a_marked_block_runs_as_written(index: int, tmp_path: Path) -> None:
    language, code = marked_blocks()[index]
    if language == "python":
        commands = [[sys.executable, "-c", code]]
    else:
        lines = [line.split("  #", 1)[0].strip() for line in code.splitlines()]
        commands = [["bash", "-c", line] for line in lines if line]
    for command in commands:
        done = run_verbatim(command, tmp_path)
        assert done.returncode == 0, f"{command[-1]!r} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    if language == "python":
        best, run_dir = done.stdout.split()[-2:]
        assert 0.0 < float(best) <= 1.0 and (tmp_path / run_dir / "rounds.parquet").is_file()
    else:
        assert (tmp_path / "runs" / "demo" / "summary.json").is_file()
