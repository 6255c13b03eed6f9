"""``benchmarks/gpu.py`` on a machine without a CUDA GPU: it says so and exits 0 (the suite runs on CPU boxes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a CUDA GPU the script measures it (minutes)")
def test_gpu_benchmark_without_cuda_exits_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "found no CUDA GPU" in done.stdout
    assert not out.exists()  # nothing measured, nothing written
