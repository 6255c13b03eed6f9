"""Every registered method trains a call's clients as one stack, with the results of training them one by one.

The contract of the one loop (:mod:`rayfed.train.loop`): a method declares its local training as phases, and
with ``engine.vectorize=on`` the worker trains its clients as one stack. For each registered algorithm, what
``rayfed check`` runs (:mod:`rayfed.checking.method_check`): two rounds of eight clients of unequal sizes, each trained
from the same message and states once with ``vectorize=off`` and once with ``on``: every call's clients train in
one stack; every client's loss, steps and update norm, the call's summed contribution and the clients' new states
agree within float tolerance (:mod:`rayfed.checking.path_comparison`); and the stacked training of the second round
(the loop's work: what stacking changes) issues well under half the ATen operations per client-step of the
sequential one (the first warms up). A new method joins this test by registering.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from rayfed.algorithms import ALGORITHMS
from rayfed.checking.method_check import TwoPaths, check_config
from rayfed.checking.path_comparison import path_differences
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.reports import TrainResult
from rayfed.train import stack_plan
from rayfed.train.lanes import Lanes, packed_lanes

_CLIENTS = 8
ON_GPU = os.environ.get("RAYFED_TEST_DEVICE") == "cuda"
"""``RAYFED_TEST_DEVICE=cuda`` (``benchmarks/gpu_suite.py`` sets it) runs both paths on the GPU; without CUDA the
tests are skipped then, so that a CPU run never passes in their place."""
OVERRIDES: dict[str, dict[str, Any]] = {  # what a method needs here (its own networks), or to stay cheap
    # Dropout (each client's own masks) and Adam at its lr. Adam steps lr·m/(√v + ε): with the default ε a gradient
    # of float-rounding size takes a full step either way, and as one client's convolutions and a stack's grouped
    # ones sum in other orders, SupCon's sharp loss parts them by up to 0.5% of an update; with ε = 0.1 the steps
    # follow the gradients, and the test checks the same loop.
    "fedclassavg": {
        "model.name": "fca_alexnet",
        "train.lr": 5e-4,
        "algorithm.params": {"adam_eps": 0.1},
        "data.options": {"num_samples": 96},
        "data.num_clients": 6,
        "train.batch_size": 4,
    },
    "ktpfl": {"algorithm.params": {"public_size": 24, "distill_batch_size": 8}},
    "apple": {"algorithm.params": {"anneal_rounds": 2}},
    "fedlaw": {"algorithm.params": {"server_epochs": 2, "proxy_size": 24}},
    "fedproto": {"model.name": "fedproto_cnn20"},  # dropout
    "sgdm": {"train.momentum": 0.9},
    "fedawa": {"train.momentum": 0.9},
    "feddyn": {"train.momentum": 0.9},
}
PADDED = ("fedavg", "feduv", "fedproto", "fedclassavg", "ktpfl")
"""Methods also run with ``train.drop_last=false``: a stack pads its clients' short last batches."""


def _paths(name: str, tmp_path: Path, **extra: Any) -> TwoPaths:
    """``rayfed check``'s two paths (:class:`~rayfed.checking.method_check.TwoPaths`) of ``name`` on its tiny data,
    with what the method needs here."""
    device = {"engine.num_gpus_per_worker": 1.0 if ON_GPU else 0.0}
    return TwoPaths(check_config(name, {**device, **OVERRIDES.get(name, {}), **extra}, clients=_CLIENTS), tmp_path)


def _train(runner: ClientRunner, *args: Any, ops: list[float] | None) -> TrainResult:
    """``runner.train(*args)``; with ``ops``, profiled: the ATen operations its training loop issued per client-step
    appended."""
    if ops is None:
        return runner.train(*args)
    loop = runner.loop
    plain = {name: getattr(loop, name) for name in ("train_one", "train_stack")}

    def marked(name: str) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            with record_function("rayfed.loop"):
                return plain[name](*a, **k)

        return run

    for name in plain:
        setattr(loop, name, marked(name))
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            result = runner.train(*args)
    finally:
        for name in plain:
            delattr(loop, name)
    events = prof.events()
    ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == "rayfed.loop"]
    count = sum(
        1
        for event in events
        if event.name.startswith("aten::") and any(a <= event.time_range.start <= b for a, b in ranges)
    )
    ops.append(count / max(sum(report.steps for report in result.reports), 1))
    return result


def _rounds(paths: TwoPaths, ops: list[float] | None = None) -> list[tuple[TrainResult, TrainResult]]:
    """Two rounds of every client, each trained one at a time and stacked from the same message and states (the
    second round profiled when ``ops`` is given)."""
    return [paths.round(0), paths.round(1, train=lambda runner, *args: _train(runner, *args, ops=ops))]


needs_the_device = pytest.mark.skipif(
    ON_GPU and not torch.cuda.is_available(), reason="RAYFED_TEST_DEVICE=cuda but this machine has no CUDA GPU"
)


@needs_the_device
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_method_stacks_with_the_results_of_training_one_by_one(name: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    # Execute: two rounds, each trained sequentially and stacked; the second profiled.
    ops: list[float] = []
    paths = _paths(name, tmp_path)
    rounds = _rounds(paths, ops)
    # Assert: every call's clients trained in one stack; their numbers, uploads and states agree; and the stack
    # issues well under half the operations per client-step.
    assert paths.stack_note() == ""
    for one, other in rounds:
        assert path_differences(one, other) == []
    sequential, stacked = ops
    if not ON_GPU:  # the host's share of the work; on a GPU both paths replay CUDA graphs, which issue no ATen ops
        assert stacked < 0.5 * sequential, (sequential, stacked)


@needs_the_device
@pytest.mark.parametrize("name", PADDED)
def test_short_last_batches_are_padded_in_a_stack(name: str, tmp_path: Path) -> None:
    paths = _paths(name, tmp_path, **{"train.drop_last": False})
    rounds = _rounds(paths)
    assert any(r.steps * 8 != r.num_train for r in rounds[0][0].reports)  # some client ends on a short batch
    assert paths.stack_note() == ""
    for one, other in rounds:
        assert path_differences(one, other) == []


@pytest.fixture
def tight_lanes(monkeypatch: pytest.MonkeyPatch) -> list[Lanes]:
    """Every stack packs its clients as tightly as a call taking twice its longest client's steps allows (a few
    clients of about equal sizes would not pack within the default slack); the layouts, noted."""
    layouts: list[Lanes] = []

    def noted(steps: Any) -> Lanes:
        layouts.append(packed_lanes(steps, slack=1.0))
        return layouts[-1]

    monkeypatch.setattr(stack_plan, "packed_lanes", noted)
    return layouts


@needs_the_device
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_method_packs_its_clients_into_lanes_with_the_results_of_training_one_by_one(
    name: str, tmp_path: Path, tight_lanes: list[Lanes]
) -> None:
    # Execute: two rounds, each trained sequentially and stacked with its clients packed into lanes.
    paths = _paths(name, tmp_path, **{"engine.pack_lanes": True})
    rounds = _rounds(paths)
    # Assert: some lane took a second client (a phase with Adam keeps a lane per client), and every client's
    # numbers, uploads and states agree with training it alone.
    assert paths.stack_note() == ""
    assert any(layout.packed for layout in tight_lanes) or name == "fedclassavg"
    for one, other in rounds:
        assert path_differences(one, other) == []


@needs_the_device
@pytest.mark.parametrize("name", PADDED)
def test_short_last_batches_are_padded_in_a_packed_stack(name: str, tmp_path: Path, tight_lanes: list[Lanes]) -> None:
    paths = _paths(name, tmp_path, **{"train.drop_last": False, "engine.pack_lanes": True})
    rounds = _rounds(paths)
    assert any(r.steps * 8 != r.num_train for r in rounds[0][0].reports)  # some client ends on a short batch
    assert any(layout.packed for layout in tight_lanes) or name == "fedclassavg"
    for one, other in rounds:
        assert path_differences(one, other) == []
