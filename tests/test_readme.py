"""The README's cheap commands and snippets run verbatim on this checkout.

A block that follows the comment ``<!-- readme-test -->`` is run as written, in a fresh folder, with the
environment's programs first on PATH (as ``source .venv/bin/activate`` puts them): a Python block as one
script, a shell block line by line, each line as one command that must succeed. A comment that says what a
command prints (``# prints: done: 3 rounds, best accuracy 0.3384``) is checked: its output holds that text.
The set-up commands (an install and the whole suite) are what ``.ci/run`` runs; the main job's figures that
the README states are those of its recorded run, and the code still gives that run's first round
(:func:`test_the_main_jobs_figures_are_those_it_prints`).

The figures are those of one kind of machine: the recorded run's ``numerics``
(:func:`rayfed.train.numerics.fingerprint`, how its CPU kernels round a training step). Where this machine's
fingerprint is another, its kernels round
otherwise and a weak model's accuracy moves in its last digits: there a stated figure is checked for its form
(``best accuracy 0.`` and four digits) and the first round of the main job is not compared, and the test says so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rayfed
from rayfed.train.numerics import fingerprint
from tests.examples.test_examples import _example

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARKER = "<!-- readme-test -->"
PRINTS = re.compile(r"#.*?prints: (.+?)\s*$")
MAIN_JOB = REPO / "benchmarks" / "results" / "main_job.json"


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


def stated_outputs(code: str) -> list[str]:
    """What the ``# prints: ...`` comments of ``code`` say it prints."""
    return [match.group(1) for line in code.splitlines() if (match := PRINTS.search(line))]


def computes_as_recorded() -> bool:
    """Whether this machine's kernels round as those of the machine the README's figures were measured on."""
    return fingerprint() == json.loads(MAIN_JOB.read_text())["numerics"]


def as_printed(stated: str, exact: bool) -> re.Pattern[str]:
    """What a ``# prints:`` text promises: itself, or where this machine rounds otherwise (``exact`` false), its
    form, each figure any four digits."""
    text = re.escape(stated)
    return re.compile(text if exact else re.sub(r"0\\.\d{4}", r"0\\.\\d{4}", text))


@pytest.mark.parametrize("index", range(2))
def test_a_marked_block_runs_as_written(index: int, tmp_path: Path) -> None:
    language, code = marked_blocks()[index]
    if language == "python":
        commands = [([sys.executable, "-c", code], stated_outputs(code))]
    else:
        lines = [(line.split("  #", 1)[0].strip(), stated_outputs(line)) for line in code.splitlines()]
        commands = [(["bash", "-c", line], stated) for line, stated in lines if line]
    exact = computes_as_recorded()
    for command, stated in commands:
        done = run_verbatim(command, tmp_path)
        assert done.returncode == 0, f"{command[-1]!r} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        for text in stated:
            printed = as_printed(text, exact).search(done.stdout)
            assert printed, f"the README says {command[-1]!r} prints {text!r}; it printed {done.stdout!r}"
    if language == "python":
        assert stated_outputs(code) and (tmp_path / done.stdout.split("results in ")[-1].strip()).is_dir()
    else:
        assert (tmp_path / "runs" / "demo" / "summary.json").is_file() and len(stated_outputs(code)) == 2


def test_the_main_jobs_figures_are_those_it_prints(tmp_path: Path) -> None:
    """The README and the example state the figures of the main job's recorded run (``--record``), and the code
    still gives that run's numbers: its first round, run again here (local backend, the same numbers as Ray's),
    is the recorded one to the last digit. A change that moves the numbers fails here; rerun the main job with
    ``--record benchmarks/results/main_job.json`` and state its figures."""
    recorded = json.loads(MAIN_JOB.read_text())
    figures = f"{recorded['final_accuracy']:.4f} against {recorded['final_global_accuracy']:.4f}"
    assert f"at {figures}, and writes" in " ".join(README.read_text().split())
    example = REPO / "examples" / "cwfedavg_1000clients.py"
    assert f"to {figures} for the global model" in " ".join(example.read_text().split())

    if not computes_as_recorded():
        pytest.skip(
            f"this machine's kernels round otherwise (numerics {fingerprint()}, the recorded run's "
            f"{recorded['numerics']}): its first round is not the recorded one to the last digit"
        )
    main_job = _example("cwfedavg_1000clients")
    config = main_job.build_config(main_job.arguments().parse_args(["--rounds", "1"]))
    local = {"engine.backend": "local", "engine.progress": False, "run_dir": str(tmp_path / "run")}
    first = rayfed.run(config.override(local)).history[0]
    assert (first["accuracy"], first["global_accuracy"]) == (
        recorded["rounds"][0]["accuracy"],
        recorded["rounds"][0]["global_accuracy"],
    )


def test_every_file_a_readme_command_names_is_in_the_repository() -> None:
    """A command names files of the repository (a config, a search space, an example) that a clone holds; those
    it writes (under runs/, ~, the results) are left out."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    named = {
        word
        for block in blocks
        for line in block.splitlines()
        for word in line.split("#", 1)[0].split()
        if re.fullmatch(r"[\w./-]+\.(py|toml|yaml|yml|json)", word) and not word.startswith(("runs/", "~"))
    }
    assert "examples/space.yaml" in named
    assert sorted(name for name in named if not (REPO / name).is_file()) == []
