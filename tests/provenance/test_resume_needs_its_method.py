"""``rayfed run --resume`` of a run whose method this process does not hold says so, and where its run registered
it, instead of blaming its intact ``config.json`` (a script that registered it under ``if __name__ ==
"__main__":``, run with ``python script.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rayfed.cli import main
from tests.conftest import tiny_overrides
from tests.util.test_plugins import USER_METHOD

SCRIPT = """
import sys

import rayfed

if __name__ == "__main__":
{method}
    rayfed.run(rayfed.RunConfig().override({overrides!r}))
"""


@pytest.mark.timeout(300)
def test_a_resume_of_a_method_registered_under_main_names_the_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: a run of a method that a script registers under `if __name__ == "__main__":`, run as a script.
    run_dir = tmp_path / "run"
    method = textwrap.indent(USER_METHOD.replace("{name}", "main_only_method"), "    ")
    overrides = tiny_overrides(run_dir, **{"algorithm.name": "main_only_method", "train.rounds": 1})
    script = tmp_path / "experiment.py"
    script.write_text(SCRIPT.format(method=method, overrides=overrides))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    # Execute
    code = main(["run", "--resume", str(run_dir), "train.rounds=2"])
    # Check: one line naming the method, the script and the fix; config.json is not blamed.
    error = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in error and "is not a readable run config" not in error
    assert "its method algorithm.name='main_only_method' is not registered in this process" in error
    assert f"in the script {str(script)!r}" in error and 'under `if __name__ == "__main__":` does not run' in error
