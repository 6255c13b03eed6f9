"""Values brought to the host (``rayfed.train.host.to_host``): one buffer for all, copied once."""

from __future__ import annotations

import numpy as np
import torch

from rayfed.train import host


def _root(array: np.ndarray) -> object:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base


def test_host_tensors_are_joined_into_one_buffer_with_one_copy(monkeypatch) -> None:
    # Prepare: host tensors; a copy from a device counted.
    copies: list[torch.Tensor] = []
    monkeypatch.setattr(host, "host_copy", lambda tensor: copies.append(tensor) or tensor.numpy().copy())
    values, flags = torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor([True, False])
    # Execute
    out_values, out_flags = host.to_host([values, flags])
    values.add_(1)  # the inputs change afterwards: the outputs are copies
    # Assert: the join made the one copy; both outputs view its buffer.
    assert copies == []
    assert out_values.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and out_flags.tolist() == [True, False]
    assert _root(out_values) is _root(out_flags) is not None
