"""The package stays readable in pieces: no module in ``rayfed/`` over 400 lines, no function or method over 80.

A module past 400 lines holds more than one concept, a function past 80 more than one decision; either is split
where it grew (the house rules, docs/architecture.md). Counted from the source, so the check is exact.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rayfed"
MODULE_LINES = 400
FUNCTION_LINES = 80


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_over_400_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in modules()
        if (n := len(path.read_text().splitlines())) > MODULE_LINES
    }
    assert len(modules()) > 100 and not long, long


def test_no_function_over_80_lines() -> None:
    long: dict[str, int] = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}"] = length
    assert not long, long
