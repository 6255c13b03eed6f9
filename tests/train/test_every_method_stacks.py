"""Every registered method trains a call's clients as one stack, with the results of training them one by one.

The contract of the one loop (:mod:`rayfed.train.loop`): a method declares its local training as phases, and
with ``engine.vectorize=on`` the worker trains its clients as one stack. For each registered algorithm, two
rounds of eight clients of unequal sizes, each trained from the same message and states once with
``vectorize=off`` and once with ``on``: every client's loss, steps and update norm, the call's summed
contribution and the clients' new states agree within float tolerance, and the stacked training of the second
round (the loop's work: what stacking changes) issues well under half the ATen operations per client-step of the
sequential one (the first warms up). A new method joins this test by registering.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from rayfed import RunConfig
from rayfed.algorithms import ALGORITHMS, RoundContext, resolve
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.reports import TrainResult
from rayfed.execution.server import Server
from tests.conftest import runner_and_server

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


def _config(name: str, vectorize: str, tmp_path: Path, **extra: Any) -> RunConfig:
    return RunConfig().override(
        {
            "data.dataset": "synthetic",
            "data.options": {"num_samples": 480},
            "data.num_clients": _CLIENTS,
            "data.partition": "dirichlet",
            "data.alpha": 1.0,
            "model.name": "cnn4",
            "algorithm.name": name,
            "train.batch_size": 8,
            "train.lr": 0.005,
            "engine.backend": "local",
            "engine.vectorize": vectorize,
            "engine.stack_size": _CLIENTS,
            "engine.torch_threads": 1,
            "engine.num_gpus_per_worker": 1.0 if ON_GPU else 0.0,
            "run_dir": str(tmp_path / vectorize),
            **OVERRIDES.get(name, {}),
            **extra,
        }
    )


def _runner(name: str, vectorize: str, tmp_path: Path, **extra: Any) -> tuple[ClientRunner, Server, RunConfig]:
    config = _config(name, vectorize, tmp_path, **extra)
    return (*runner_and_server(config, tmp_path / vectorize), config)


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


def _rounds(
    name: str, tmp_path: Path, ops: list[float] | None = None, **extra: Any
) -> list[tuple[TrainResult, TrainResult]]:
    """Two rounds of every client, as the engine runs them, each trained sequentially and stacked from the same
    message and states (the second round profiled when ``ops`` is given); the sequential results carry the run
    on."""
    sequential, server, config = _runner(name, "off", tmp_path, **extra)
    stacked, _, _ = _runner(name, "on", tmp_path, **extra)
    states: dict[int, Any] = {}
    results = []
    clients = config.data.num_clients
    for t in range(2):
        ctx = RoundContext(round=t, seed=0, lr=config.train.lr, sampled=np.arange(clients))
        message = server.broadcast()
        one, other = (
            _train(runner, message, ctx, list(range(clients)), states, ops=ops if t else None)
            for runner in (sequential, stacked)
        )
        states.update(one.states)
        server.aggregate(ctx, one.contribution)
        results.append((one, other))
    return results


def _arrays(value: Any) -> list[np.ndarray]:
    """Every number a contribution or a state holds, as arrays in a fixed order."""
    if value is None:
        return []
    if isinstance(value, np.ndarray | np.generic | int | float):
        return [np.asarray(value, dtype=np.float64)]
    if isinstance(value, dict):
        return [a for key in sorted(value) for a in _arrays(value[key])]
    if dataclasses.is_dataclass(value):
        return [a for f in dataclasses.fields(value) for a in _arrays(getattr(value, f.name))]
    return []


def _close(a: np.ndarray, b: np.ndarray) -> None:
    """Equal up to float rounding, grown by two rounds of training: the bulk of the entries within 1e-4 of the
    array's largest value, and every entry within 1e-2 of it (a stack sums its convolutions in another order than
    one client does, and where that flips a ReLU or a max-pool tie of a client, a few entries move further)."""
    scale = max(1.0, float(np.abs(b).max(initial=0.0)))
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    assert float(diff.max(initial=0.0)) <= 1e-2 * scale, (float(diff.max()), scale)
    assert float(np.quantile(diff, 0.999)) <= 1e-4 * scale if diff.size else True, (np.quantile(diff, 0.999), scale)


def _assert_same(sequential: TrainResult, stacked: TrainResult) -> None:
    for one, other in zip(sequential.reports, stacked.reports):
        assert (one.client_id, one.steps, one.rejected) == (other.client_id, other.steps, other.rejected)
        for a, b in ((one.train_loss, other.train_loss), (one.update_norm, other.update_norm)):
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-3, abs=1e-5)
    for a, b in zip(_arrays(sequential.contribution), _arrays(stacked.contribution), strict=True):
        _close(a, b)
    assert sorted(sequential.states) == sorted(stacked.states)
    for cid in sequential.states:
        for a, b in zip(_arrays(sequential.states[cid]), _arrays(stacked.states[cid]), strict=True):
            _close(a, b)


needs_the_device = pytest.mark.skipif(
    ON_GPU and not torch.cuda.is_available(), reason="RAYFED_TEST_DEVICE=cuda but this machine has no CUDA GPU"
)


@needs_the_device
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_method_stacks_with_the_results_of_training_one_by_one(name: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    # Execute: two rounds, each trained sequentially and stacked; the second profiled.
    ops: list[float] = []
    rounds = _rounds(name, tmp_path, ops)
    # Assert: the algorithm declares it stacks; the clients' numbers, uploads and states agree; and the stack
    # issues well under half the operations per client-step.
    capabilities = resolve(_config(name, "on", tmp_path).algorithm).capabilities
    assert capabilities.stacks, f"{name} declares it cannot stack: {capabilities.reason}"
    for one, other in rounds:
        _assert_same(one, other)
    sequential, stacked = ops
    if not ON_GPU:  # the host's share of the work; on a GPU both paths replay CUDA graphs, which issue no ATen ops
        assert stacked < 0.5 * sequential, (sequential, stacked)


@needs_the_device
@pytest.mark.parametrize("name", PADDED)
def test_short_last_batches_are_padded_in_a_stack(name: str, tmp_path: Path) -> None:
    rounds = _rounds(name, tmp_path, **{"train.drop_last": False})
    assert any(r.steps * 8 != r.num_train for r in rounds[0][0].reports)  # some client ends on a short batch
    for one, other in rounds:
        _assert_same(one, other)
