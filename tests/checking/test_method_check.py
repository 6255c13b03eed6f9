"""``rayfed check`` (``rayfed.checking.method_check``): what it says of a method's mistakes, each named by the hook and
its line with the fix, and how two trainings of a call are compared (``rayfed.checking.path_comparison``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

import rayfed
from rayfed.algorithms import WeightedSum
from rayfed.checking.path_comparison import array_difference, path_differences
from rayfed.execution.reports import ClientReport, TrainResult

PROBES = """
import torch
from rayfed.algorithms import NoParams, register_algorithm
from rayfed.algorithms.common.global_model import GlobalModelClient
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.train.phase import Phase


def positive_part(logits):
    return logits[logits > 0].sum()


class Probe(GlobalModelClient):
    def phases(self, message, job):
        if self.kind == "per_client":
            weight = torch.tensor(float(job.client_id))
            return [Phase(epochs=1, loss=lambda out, batch, params, constants: weight * out.logits.mean())]
        return [Phase(epochs=1, loss=self.term)]

    def term(self, out, batch, params, constants):
        if self.kind == "item":
            return out.logits.square().mean() / out.logits.abs().max().item()
        if self.kind == "mask":
            return 0.01 * positive_part(out.logits)
        if self.kind == "branch":
            return out.logits.mean() if out.logits.mean() > 0 else -out.logits.mean()
        if self.kind == "random":
            return torch.rand(()) * out.logits.mean()
        return params[99].sum()


for kind in ("item", "mask", "branch", "random", "per_client", "bug"):
    client = type(f"{kind.title()}Probe", (Probe,), {"kind": kind})
    register_algorithm(f"probe_{kind}", params=NoParams, server=FedAvgServer, client=client, summary=kind)
"""


def test_each_mistake_is_one_line_naming_the_hook_its_line_and_the_fix(tmp_path: Path) -> None:
    # Prepare: six methods in one file of the user's, checked in a process of their own.
    probes = tmp_path / "probes.py"
    probes.write_text(PROBES)
    # Execute
    done = subprocess.run(
        [sys.executable, "-m", "rayfed", "check", str(probes)], capture_output=True, text=True, timeout=900
    )
    # Assert
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "the loss Probe.term (probes.py:22) calls .item() (or float() or int() of a tensor)" in out
    assert "keep the value a tensor" in out
    assert "the loss Probe.term, in positive_part (probes.py:10), makes a shape that depends on the data" in out
    assert "weigh by the mask instead" in out
    assert "the loss Probe.term (probes.py:26) branches in Python on a tensor's value" in out
    assert "the loss Probe.term (probes.py:28) draws random numbers inside a step" in out
    assert "the loss Probe.term (probes.py:29) raised IndexError" in out
    # A loss made per client trains, but in stacks of one: the check says so and why, and the losses agree.
    per_client = out.split("rayfed check probe_per_client")[1].split("rayfed check")[0]
    assert "stacks: no (its clients train in stacks of [1], not 8: phase 0's loss is a different function" in per_client
    assert "stacked and one at a time: equal" in per_client


def test_a_refused_config_is_a_mistake_with_the_refusal_and_its_fix() -> None:
    report = rayfed.check("fedclassavg")  # its networks are fca_*: cnn4 has no extractor and classifier
    assert not report.ok and not report.stacks
    (mistake,) = report.mistakes
    assert "algorithm.name='fedclassavg' shares the classifier 'classifier.1', but model 'cnn4'" in mistake
    assert "use FedClassAvg's networks" in mistake


def _result(losses: list[float], total: np.ndarray, states: dict[int, dict[str, np.ndarray]]) -> TrainResult:
    reports = [ClientReport(i, 10, loss, 5, 1.0, 8, 8, 0.1) for i, loss in enumerate(losses)]
    return TrainResult(WeightedSum.of(total, 1.0), reports, states)


def test_two_trainings_agree_within_rounding_and_each_difference_is_named() -> None:
    base = np.linspace(-1.0, 1.0, 2000)
    same = _result([0.5, 0.7], base, {1: {"head": base[:10]}})
    rounded = _result([0.5 * (1 + 1e-4), 0.7], base + 1e-7, {1: {"head": base[:10] + 1e-7}})
    assert path_differences(same, rounded) == []
    # A client's loss off by 1 %, the upload off everywhere by 1e-3 (of values up to 1), a state moved.
    other = _result([0.505, 0.7], base + 1e-3, {1: {"head": base[:10] + 0.5}})
    found = path_differences(same, other)
    assert len(found) == 3, found
    assert found[0] == "client 0: loss 0.5 one at a time, 0.505 stacked"
    assert found[1].startswith("the summed upload's array 0: differ by up to 0.001")
    assert found[2].startswith("client 1's state, array 0: differ by up to 0.5")
    assert array_difference(np.zeros(3), np.zeros(4)) == "shapes (3,) and (4,)"
