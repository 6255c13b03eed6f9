"""The step's backward: the gradients of ``loss.backward()``, and no import of sympy in a worker's process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch import nn

from rayfed.train.flat import FlatModel
from rayfed.train.step import backward_from, unit


def _input_and_two_alike_models() -> tuple[torch.Tensor, list[FlatModel]]:
    """A batch of 6 images and two models with the same initial weights."""
    torch.manual_seed(0)
    x = torch.randn(6, 1, 8, 8)
    nets = []
    for _ in range(2):
        torch.manual_seed(1)
        nets.append(FlatModel(nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 6 * 6, 4))))
    return x, nets


def test_backward_from_gives_the_gradients_of_backward() -> None:
    x, nets = _input_and_two_alike_models()
    nets[0].module(x).logsumexp(1).mean().backward()
    backward_from(nets[1].module(x).logsumexp(1).mean(), unit(x.device))
    assert nets[0].grad.abs().sum() > 0
    assert torch.equal(nets[0].grad, nets[1].grad)


def test_backward_from_inputs_returns_their_gradients_and_leaves_grad_alone() -> None:
    """With ``inputs`` (one client's step), the gradients come back as autograd computes them, in the inputs'
    order, and nothing is added into any ``.grad``: the flat gradient buffer stays as it was."""
    x, nets = _input_and_two_alike_models()
    nets[0].module(x).logsumexp(1).mean().backward()
    grads = backward_from(nets[1].module(x).logsumexp(1).mean(), unit(x.device), nets[1].params)
    assert [tuple(g.shape) for g in grads] == [tuple(p.shape) for p in nets[1].params]
    assert torch.equal(
        torch.cat([g.reshape(-1) for g in grads]), torch.cat([p.grad.reshape(-1) for p in nets[0].params])
    )
    assert not nets[1].grad.any()


def test_a_run_imports_no_sympy(tmp_path: Path) -> None:
    """Training (sequential and stacked) and the memory estimate (models on the meta device) leave sympy
    unimported: importing it through ``torch.fx``'s symbolic shapes costs every worker about 32 MB."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from conftest import tiny_overrides
        from rayfed import RunConfig, run
        for vectorize in ("off", "on"):
            run(RunConfig().override(tiny_overrides({str(tmp_path)!r} + "/" + vectorize, **{{
                "train.rounds": 1, "engine.vectorize": vectorize}})))
        print(sorted({{"sympy", "torch.fx.experimental.symbolic_shapes"}} & set(sys.modules)))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
