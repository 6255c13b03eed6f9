"""A benchmark imports the rayfed that ``PYTHONPATH`` names: ``benchmarks/compare.py`` measures a base commit by
running the same script with that version's tree first on ``PYTHONPATH`` (driver and Ray's workers alike), so a
script that puts this checkout's root on ``sys.path`` would run this checkout's driver against the base's workers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def _inserted_paths(script: Path) -> list[Path]:
    """The folders ``script`` puts on ``sys.path`` at its top level (``sys.path.insert(i, EXPR)``, EXPR of
    ``Path(__file__)``), evaluated as if the script ran from where it lies."""
    paths = []
    for node in ast.parse(script.read_text()).body:
        call = node.value if isinstance(node, ast.Expr) else None
        if not (isinstance(call, ast.Call) and ast.unparse(call.func) in {"sys.path.insert", "sys.path.append"}):
            continue
        expression = ast.unparse(call.args[-1])
        paths.append(Path(eval(expression, {"Path": Path, "str": str, "__file__": str(script)})))  # noqa: S307
    return paths


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_benchmark_puts_a_rayfed_ahead_of_pythonpath(script: Path) -> None:
    for folder in _inserted_paths(script):
        assert not (folder / "rayfed").is_dir(), (
            f"{script.name} puts {folder} on sys.path, which holds a rayfed package: compare.py's base runs would "
            "import this checkout's rayfed in the driver; import rayfed as installed (or by PYTHONPATH) instead"
        )


def test_the_check_sees_a_root_insert(tmp_path: Path) -> None:
    script = tmp_path / "benchmarks" / "bad.py"
    script.parent.mkdir()
    (tmp_path / "rayfed").mkdir()
    script.write_text(
        "import sys\nfrom pathlib import Path\n\nsys.path.insert(0, str(Path(__file__).resolve().parents[1]))\n"
    )
    assert _inserted_paths(script) == [tmp_path.resolve()]
    with pytest.raises(AssertionError, match="holds a rayfed package"):
        test_no_benchmark_puts_a_rayfed_ahead_of_pythonpath(script)
