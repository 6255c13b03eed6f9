"""Which device a worker trains on, and the check that an in-process run can have the GPU it asks for."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rayfed.util.errors import ResourceError

if TYPE_CHECKING:
    from rayfed.config import EngineConfig

__all__ = ["pick_device", "check_local_gpu"]


def pick_device(num_gpus: float) -> torch.device:
    """CUDA when the worker was given a (fraction of a) GPU, else CPU.

    The CUDA device carries its index (``cuda:0``, as every tensor on it reports its device), so that comparing a
    tensor's device with the worker's is true where they are the same device (``cuda != cuda:0`` in PyTorch).
    On CUDA, convolutions compute in full float32 (cuDNN's TF32 off, as matrix products already are): with TF32,
    a stacked step, a replayed one and a client trained alone round differently (cuDNN picks other algorithms for
    each), and a stack's clients would not train to the numbers of training them one by one."""
    if num_gpus > 0 and torch.cuda.is_available():
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_local_gpu(engine: EngineConfig) -> None:
    """``engine.backend=local`` trains in this process: GPUs per worker > 0 needs CUDA here."""
    if engine.num_gpus_per_worker > 0 and not torch.cuda.is_available():
        raise ResourceError(
            f"engine.num_gpus_per_worker={engine.num_gpus_per_worker:g} but this machine has no CUDA GPU; "
            "set engine.num_gpus_per_worker=0 to train on CPUs"
        )
