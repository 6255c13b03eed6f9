"""Which device a worker trains on, whether it stacks its clients there, and the check that an in-process run can
have the GPU it asks for. torch is imported on first use: the decision whether a run stacks is also made from its
config alone, before anything runs (:mod:`rayfed.execution.run_packs`), where torch is not needed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayfed.util.errors import ResourceError

if TYPE_CHECKING:
    import torch

    from rayfed.config import EngineConfig

__all__ = ["pick_device", "check_local_gpu", "local_device", "stacks_on"]


def pick_device(num_gpus: float) -> torch.device:
    """CUDA when the worker was given a (fraction of a) GPU, else CPU.

    The CUDA device carries its index (``cuda:0``, as every tensor on it reports its device), so that comparing a
    tensor's device with the worker's is true where they are the same device (``cuda != cuda:0`` in PyTorch).
    On CUDA, convolutions compute in full float32 (cuDNN's TF32 off, as matrix products already are): with TF32,
    a stacked step, a replayed one and a client trained alone round differently (cuDNN picks other algorithms for
    each), and a stack's clients would not train to the numbers of training them one by one."""
    import torch

    if num_gpus > 0 and torch.cuda.is_available():
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_local_gpu(engine: EngineConfig) -> None:
    """``engine.backend=local`` trains in this process: GPUs per worker > 0 needs CUDA here."""
    import torch

    if engine.num_gpus_per_worker > 0 and not torch.cuda.is_available():
        raise ResourceError(
            f"engine.num_gpus_per_worker={engine.num_gpus_per_worker:g} but this machine has no CUDA GPU; "
            "set engine.num_gpus_per_worker=0 to train on CPUs"
        )


def local_device(engine: EngineConfig) -> str:
    """The type of device (``cuda``, ``cpu``) a run on the local backend trains on, known from its config before
    anything runs: CUDA where it asks for a GPU share, else the CPU. This is :func:`pick_device`'s choice wherever
    such a run trains: without CUDA here, :func:`check_local_gpu` refuses a run that asks for a GPU before anything
    is written."""
    return "cuda" if engine.num_gpus_per_worker > 0 else "cpu"


def stacks_on(vectorize: str, device_type: str) -> bool:
    """Whether clients training on a device of ``device_type`` (``cuda``, ``cpu``) train as stacks:
    ``engine.vectorize`` ``on``/``off``, or ``auto`` = stacked on CUDA, one at a time on the CPU.

    On a GPU one client's step is latency-bound (a few kernels on a small batch), so a step of C clients costs
    little more than one; on a CPU the arithmetic is the bound and stacking gains nothing (benchmarks/README.md,
    "Stacked against sequential training"). The one decision: a worker asks it of its own device
    (:class:`~rayfed.execution.client_runner.ClientRunner`), :func:`~rayfed.execution.run_packs.alone_reason` of
    :func:`local_device` before a run starts."""
    if vectorize == "auto":
        return device_type == "cuda"
    return vectorize == "on"
