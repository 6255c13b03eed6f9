"""On a GPU, a worker's training call waits for the device once: when it reads its numbers back.

``torch.cuda.set_sync_debug_mode("error")`` makes every operation that would make the host wait for the GPU
raise (a scalar read, a data-dependent shape, a blocking copy either way). A call of ``ClientRunner.train``
runs under it, sequential and stacked, with and without CUDA graphs, after a first call that builds the
models, captures the steps and fills the allocator; the one read-back of the call (``to_host`` in the
settlement) is the only sync allowed. Skipped without a GPU (the CPU proxies are in
``tests/benchmarks/test_step_overhead.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rayfed import RunConfig
from rayfed.algorithms import RoundContext
from rayfed.execution import settlement
from tests.conftest import runner_and_server

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA sync debug mode needs a CUDA GPU")


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("vectorize", ["off", "on"])
@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "cwfedavg"])
def test_a_training_call_reads_back_once(
    algorithm: str, vectorize: str, graphs: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a worker on the GPU, its first call done (models built, steps captured).
    config = RunConfig().override(
        {
            "data.options": {"num_samples": 600},
            "data.num_clients": 6,
            "algorithm.name": algorithm,
            "engine.num_gpus_per_worker": 1.0,
            "engine.vectorize": vectorize,
            "engine.cuda_graphs": graphs,
            "engine.backend": "local",
            "run_dir": str(tmp_path / "run"),
        }
    )
    runner, server = runner_and_server(config, tmp_path / "run")
    message = server.broadcast()
    ctx = RoundContext(round=0, seed=0, lr=config.train.lr, sampled=np.arange(6))
    runner.train(message, ctx, list(range(6)))
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
    # Execute: the second call, every other sync an error.
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        result = runner.train(message, ctx, list(range(6)))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    # Assert
    assert len(reads) == 1 and result.contribution is not None
    assert all(report.steps > 0 for report in result.reports)
