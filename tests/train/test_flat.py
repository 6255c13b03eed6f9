"""FlatModel: parameters and gradients live in one buffer; the fused SGD step equals torch's SGD."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rayfed.train.flat import FlatModel


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def test_parameters_are_views_of_the_flat_vector() -> None:
    flat = FlatModel(_net())
    flat.load(np.arange(flat.size, dtype=np.float32))
    first = next(flat.module.parameters())
    assert first.data_ptr() == flat.vector.data_ptr()
    assert float(first.detach().reshape(-1)[1]) == 1.0


def test_backward_accumulates_into_the_flat_gradient() -> None:
    flat = FlatModel(_net())
    flat.module(torch.randn(2, 1, 8, 8)).sum().backward()
    grads = torch.cat([p.grad.reshape(-1) for p in flat.params])
    assert torch.equal(grads, flat.grad) and flat.grad.abs().sum() > 0


def test_convolution_kernels_are_stored_channels_last_and_compute_the_same() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 2))
    original = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(5, 3, 8, 8)
    expected = net(x)
    flat = FlatModel(net)
    kernel = net[0].weight
    assert kernel.is_contiguous(memory_format=torch.channels_last) and not kernel.is_contiguous()
    assert kernel.grad.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(kernel, original["0.weight"])  # same values, new layout
    assert torch.equal(flat.vector[: kernel.numel()], original["0.weight"].permute(0, 2, 3, 1).reshape(-1))
    assert net(x)[0].is_contiguous() and torch.allclose(net(x), expected, atol=1e-5)
    net(x).square().sum().backward()
    reference = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 2))
    reference.load_state_dict(original)
    reference(x).square().sum().backward()
    assert torch.allclose(kernel.grad, reference[0].weight.grad, atol=1e-4)
    assert flat.grad.abs().sum() > 0 and torch.allclose(
        flat.grad[: kernel.numel()], reference[0].weight.grad.permute(0, 2, 3, 1).reshape(-1), atol=1e-4
    )


def test_slice_of_returns_a_module_by_prefix() -> None:
    flat = FlatModel(_net())
    part = flat.slice_of("4")
    assert part.stop - part.start == 4 * 36 * 3 + 3


def test_state_vector_round_trip_includes_batchnorm_statistics() -> None:
    flat = FlatModel(_net())
    flat.module.train()
    flat.module(torch.randn(4, 1, 8, 8))
    state = flat.state_numpy()
    assert state.size == flat.size + 8  # running_mean + running_var of 4 channels
    other = FlatModel(_net())
    other.load_state(state)
    assert np.array_equal(other.state_numpy(), state)
