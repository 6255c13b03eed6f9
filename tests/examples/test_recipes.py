"""The recipes of docs/methods.md (``examples/recipes/*.py``) run through ``rayfed check``: each stacks, with the
losses, uploads and states of training its clients one at a time; and ``rayfed check`` names a loss that calls
``.item()`` and its fix."""

from __future__ import annotations

import re
import subprocess
import sys
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


ITEM_PROBE = """
import torch
from rayfed.algorithms import NoParams, register_algorithm
from rayfed.algorithms.common.global_model import GlobalModelClient
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.train.phase import Phase


class ItemClient(GlobalModelClient):
    def phases(self, message, job):
        return [Phase(epochs=1, loss=self.logit_penalty)]

    def logit_penalty(self, out, batch, params, constants):
        scale = out.logits.abs().max().item()  # a read back to the host
        return out.logits.square().mean() / scale


register_algorithm("item_probe", params=NoParams, server=FedAvgServer, client=ItemClient, summary="calls .item()")
"""


def test_rayfed_check_names_a_loss_that_calls_item_and_the_fix(tmp_path: Path) -> None:
    # Prepare: a method whose loss reads a value back (in its own process: the registration stays there).
    probe = tmp_path / "item_probe.py"
    probe.write_text(ITEM_PROBE)
    # Execute
    done = subprocess.run(
        [sys.executable, "-m", "rayfed", "check", str(probe)], capture_output=True, text=True, timeout=600
    )
    # Assert: exit 1, one line naming the loss, its line, what it does and the fix.
    assert done.returncode == 1, done.stdout + done.stderr
    (mistake,) = [line for line in done.stdout.splitlines() if "mistake:" in line]
    assert "the loss ItemClient.logit_penalty (item_probe.py:14) calls .item()" in mistake
    assert "keep the value a tensor" in mistake


def test_docs_methods_shows_every_recipe_as_its_file_holds_it() -> None:
    page = (RECIPES.parents[1] / "docs" / "methods.md").read_text(encoding="utf-8")
    shown = dict(re.findall(r"<!-- recipe: examples/recipes/(\w+)\.py -->\n```python\n(.*?)```", page, flags=re.DOTALL))
    assert sorted(shown) == sorted(path.stem for path in RECIPES.glob("*.py"))
    for name, code in shown.items():
        assert code == (RECIPES / f"{name}.py").read_text(encoding="utf-8"), f"docs/methods.md's copy of {name}.py"
