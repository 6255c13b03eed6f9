"""A worker's training call reads the device back once, for every registered method.

Every value a call makes (each client's loss and update norm, the uploads, the states clients keep) stays on the
worker's device until the settlement brings them over in one transfer (``to_host`` in
:mod:`rayfed.execution.settlement`); a client half's ``start``, ``phases`` and ``upload`` read nothing back, so a
stack of clients costs one wait for the device, not one per client.

* On a GPU, ``torch.cuda.set_sync_debug_mode("error")`` makes every operation that would make the host wait for
  the GPU raise (a scalar read, a data-dependent shape, a blocking copy either way); a second call of every method,
  sequential and stacked, with and without CUDA graphs, runs under it. Skipped without a GPU.
* On a CPU, the same calls run under a ``TorchFunctionMode`` that counts every read of a tensor's values (``.cpu()``,
  ``.numpy()``, ``.item()``, ``.tolist()``, ``float(t)``, ``bool(t)``, an index given as a 0-d tensor, an output
  sized by the values such as ``torch.bincount``'s, ...) besides the one ``to_host`` and the
  reads of host-made values (``rayfed.train.host.host_values``: a CPU generator's batch orders): none may happen.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from rayfed import RunConfig
from rayfed.algorithms import ALGORITHMS, RoundContext
from rayfed.execution import settlement
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.reports import TrainResult
from rayfed.execution.server import Server
from rayfed.train import batches
from tests.conftest import runner_and_server
from tests.train.test_every_method_stacks import OVERRIDES

_CLIENTS = 6
READS = frozenset({"cpu", "tolist", "item", "numpy", "__array__", "__float__", "__int__", "__bool__", "__index__"})
"""Tensor methods that bring a tensor's values to the host."""
SIZED_BY_VALUES = frozenset({"bincount", "nonzero", "argwhere", "unique", "unique_consecutive", "masked_select"})
"""Operations whose output's size depends on the values: on a GPU the host waits for them to learn it."""


def _syncs_on_a_gpu(func: Any, args: Any, kwargs: Any) -> bool:
    """Whether ``func(*args, **kwargs)`` reads values back on a GPU: a read (:data:`READS`), an output sized by the
    values (:data:`SIZED_BY_VALUES`, ``repeat_interleave`` of tensor repeats without ``output_size``), or an index
    given as a 0-d integer tensor (``models[cluster]``: its ``__index__`` reads it)."""
    name = getattr(func, "__name__", "")
    if name in READS or name in SIZED_BY_VALUES:
        return True
    if name == "repeat_interleave":
        repeats = args[1] if len(args) > 1 else (kwargs or {}).get("repeats")
        return isinstance(repeats, torch.Tensor) and "output_size" not in (kwargs or {})
    if name == "__getitem__":
        index = args[1] if len(args) > 1 else None
        parts = index if isinstance(index, tuple) else (index,)
        return any(isinstance(i, torch.Tensor) and i.dim() == 0 and not i.is_floating_point() for i in parts)
    return False


def _worker(name: str, tmp_path: Path, **engine: Any) -> tuple[ClientRunner, Server, RunConfig]:
    config = RunConfig().override(
        {
            "data.options": {"num_samples": 480},
            "data.num_clients": _CLIENTS,
            "algorithm.name": name,
            "train.batch_size": 8,
            "engine.backend": "local",
            "engine.stack_size": _CLIENTS,
            "run_dir": str(tmp_path / "run"),
            **{f"engine.{k}": v for k, v in engine.items()},
            **OVERRIDES.get(name, {}),
        }
    )
    return (*runner_and_server(config, tmp_path / "run"), config)


def _second_call(runner: ClientRunner, server: Server, config: RunConfig, measured: Any) -> TrainResult:
    """Round 0 as the engine runs it (models built, steps captured), then round 1 under ``measured`` (a context)."""
    ctx = RoundContext(round=0, seed=0, lr=config.train.lr, sampled=np.arange(_CLIENTS))
    first = runner.train(server.broadcast(), ctx, list(range(_CLIENTS)))
    server.aggregate(ctx, first.contribution)
    message = server.broadcast()
    ctx = RoundContext(round=1, seed=0, lr=config.train.lr, sampled=np.arange(_CLIENTS))
    with measured:
        return runner.train(message, ctx, list(range(_CLIENTS)), first.states)


class HostReads(TorchFunctionMode):
    """Counts the operations that read tensors' values back on a GPU (:func:`_syncs_on_a_gpu`) outside the allowed
    functions, and where each was made."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []
        self.allowed = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.allowed and _syncs_on_a_gpu(func, args, kwargs):
            import traceback

            frame = traceback.extract_stack()[-3]
            self.reads.append(f"{func.__name__} at {frame.filename}:{frame.lineno}")
        return func(*args, **(kwargs or {}))

    def allowing(self, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            self.allowed += 1
            try:
                return fn(*args)
            finally:
                self.allowed -= 1

        return call


@contextmanager
def _counting(mode: HostReads, transfers: list[int]) -> Iterator[None]:
    transfers.clear()
    with mode:
        yield


@pytest.mark.parametrize("vectorize", ["off", "on"])
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_training_call_reads_its_values_back_once_on_the_cpu(
    name: str, vectorize: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a worker, and the count of every read of a tensor's values.
    torch.set_num_threads(1)
    runner, server, config = _worker(name, tmp_path, vectorize=vectorize)
    mode = HostReads()
    transfers: list[int] = []
    read_back = settlement.to_host

    def counted(tensors: Any) -> Any:
        transfers.append(len(tensors))
        return read_back(tensors)

    monkeypatch.setattr(settlement, "to_host", mode.allowing(counted))
    monkeypatch.setattr(batches, "host_values", mode.allowing(batches.host_values))
    # Execute: the second call counted (the first built the models)
    result = _second_call(runner, server, config, _counting(mode, transfers))
    # Assert: one transfer, nothing else read; every client trained.
    assert len(transfers) == 1, transfers
    assert mode.reads == [], mode.reads
    assert all(report.steps > 0 for report in result.reports)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA sync debug mode needs a CUDA GPU")
@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("vectorize", ["off", "on"])
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_training_call_reads_back_once_on_a_gpu(
    name: str, vectorize: str, graphs: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a worker on the GPU, its first call done (models built, steps captured).
    runner, server, config = _worker(name, tmp_path, num_gpus_per_worker=1.0, vectorize=vectorize, cuda_graphs=graphs)
    reads = []
    read_back = settlement.to_host

    def allowed(tensors):  # noqa: ANN001, ANN202
        reads.append(len(tensors))
        torch.cuda.set_sync_debug_mode(0)
        try:
            return read_back(tensors)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(settlement, "to_host", allowed)

    class SyncsAreErrors:
        def __enter__(self) -> None:
            reads.clear()  # the first call's read-back is not the measured call's
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")

        def __exit__(self, *exc: object) -> None:
            torch.cuda.set_sync_debug_mode(0)

    # Execute: the second call, every other sync an error.
    result = _second_call(runner, server, config, SyncsAreErrors())
    # Assert
    assert len(reads) == 1 and result.contribution is not None
    assert all(report.steps > 0 for report in result.reports)
