"""The recipes of docs/methods.md (``examples/recipes/*.py``) run through ``rayfed check``: each stacks, with the
losses, uploads and states of training its clients one at a time; and the page shows each as its file holds it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rayfed.cli import main

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "recipes"


def test_every_recipe_is_checked_here() -> None:
    assert sorted(path.stem for path in RECIPES.glob("*.py")) == ["loss_term", "personal_head", "server_rule"]


@pytest.mark.parametrize(
    ("recipe", "method", "upload"),
    [
        ("loss_term", "logit_adjust", "2,328,112"),  # cnn4's state and a weight: FedAvg's upload
        ("personal_head", "head_first", "2,307,592"),  # the body alone (the head, 10 x 512 + 10, stays)
        ("server_rule", "fedavgm", "2,328,112"),
    ],
)
def test_a_recipe_stacks_with_equal_losses_under_rayfed_check(
    recipe: str, method: str, upload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Execute: the command a reader runs, on the recipe's file.
    status = main(["check", str(RECIPES / f"{recipe}.py")])
    out = capsys.readouterr().out
    # Assert
    assert status == 0, out
    assert out.splitlines()[0].startswith(f"rayfed check {method}: 2 rounds of 8 clients")
    assert "  stacks: yes" in out and "stacked and one at a time: equal" in out
    assert f"upload: {upload} bytes a client" in out


def test_docs_methods_shows_every_recipe_as_its_file_holds_it() -> None:
    page = (RECIPES.parents[1] / "docs" / "methods.md").read_text(encoding="utf-8")
    shown = dict(re.findall(r"<!-- recipe: examples/recipes/(\w+)\.py -->\n```python\n(.*?)```", page, flags=re.DOTALL))
    assert sorted(shown) == sorted(path.stem for path in RECIPES.glob("*.py"))
    for name, code in shown.items():
        assert code == (RECIPES / f"{name}.py").read_text(encoding="utf-8"), f"docs/methods.md's copy of {name}.py"
