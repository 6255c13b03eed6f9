"""How this machine's PyTorch rounds a training step: a fingerprint of the CPU kernels a run's numbers come from.

The same config gives the same numbers on any number of workers and any cluster shape, but not on every CPU:
PyTorch picks its convolution (oneDNN), matrix (MKL) and element-wise (ATen) kernels by the instruction set and
vendor of the processor, and they round differently (PyTorch's own notes on reproducibility say as much). A
weak model's pooled accuracy then moves in its third or fourth digit. The README states the figures of runs on one
kind of machine (``benchmarks/results/main_job.json`` records its fingerprint); :func:`fingerprint` says whether
this machine computes as that one did (``python -m rayfed.train.numerics`` prints it). It runs rayfed's own
model (cnn4, channels-last parameters as ``rayfed.train.flat`` stores them) through steps of plain SGD on fixed
data in one thread and hashes every resulting parameter, so it changes only with the kernels, not with rayfed.
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F

from rayfed.models import build_model

__all__ = ["fingerprint"]


def fingerprint(steps: int = 3) -> str:
    """A 16-hex-digit digest of ``steps`` SGD steps of cnn4 on fixed random 1x28x28 images, one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        torch.manual_seed(0)
        model = build_model("cnn4", (1, 28, 28), 10).to(memory_format=torch.channels_last)
        x = torch.randn(10, 1, 28, 28, generator=generator).to(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (10,), generator=generator)
        optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(steps):
            optimiser.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimiser.step()
        digest = hashlib.sha256()
        for parameter in model.parameters():
            digest.update(parameter.detach().contiguous().numpy().tobytes())
        return digest.hexdigest()[:16]
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    print(fingerprint())
