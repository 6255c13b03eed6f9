"""A model's parameters as one flat float32 vector, shared in place with the module.

Federated simulation loads, reads and averages whole models thousands of times per
second. :class:`FlatModel` re-binds every parameter of a module (and its gradient)
to a view into one contiguous buffer, so that

* loading a client's starting point is one ``copy_`` of P floats,
* reading the trained model is one ``clone`` (or zero-copy numpy view),
* a backward run on the module (outside the training loop: a test, a user's own code) leaves the whole
  gradient in one vector too, :attr:`FlatModel.grad` (the loop's steps take their gradients from backward
  directly and update the parameters tensor by tensor, :mod:`rayfed.train.sequential`),
* BatchNorm running statistics live in a second flat buffer, so a model's whole state
  is one vector too (:meth:`FlatModel.state_numpy`),
* a *part* of the model (a layer, the output layer, the class-wise blocks) is a
  contiguous slice: :meth:`FlatModel.slice_of` returns it by name prefix,
* convolution kernels (4-D parameters) are stored channels-last, (O, H, W, I) in the
  vector, so the convolutions run on channels-last activations, which makes small CNNs
  markedly faster on CPU (benchmarks/README.md, "Channels-last convolution kernels").
  Every ``FlatModel`` lays a module out the same way, so vectors stay comparable across
  clients, workers and the server; :meth:`ParamLayout.view` gives a parameter's tensor.

Nothing here assumes that all clients share one architecture: every architecture has
its own ``FlatModel`` and algorithms exchange only the parts they name.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from rayfed.train.host import host_copy, to_device
from rayfed.train.layout import ParamLayout

__all__ = ["FlatModel"]


class FlatModel:
    """A module whose parameters and gradients live in two flat float32 buffers.

    >>> net = nn.Linear(3, 2)
    >>> flat = FlatModel(net)
    >>> flat.vector.shape
    torch.Size([8])
    >>> flat.load(np.zeros(8, dtype=np.float32)); float(net.weight.detach().sum())
    0.0
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.layout = ParamLayout.of(named, channels_last=True)
        self.params = [p for _, p in named]
        device = self.params[0].device if self.params else torch.device("cpu")
        self.vector = torch.empty(self.layout.size, dtype=torch.float32, device=device)
        # not zeros_like: on the meta device (memory estimates) that goes through torch._refs, which imports sympy
        self.grad = torch.zeros(self.layout.size, dtype=torch.float32, device=device)
        for i, (_, param) in enumerate(named):
            self.layout.view(self.vector, i).copy_(param.detach())
            param.data = self.layout.view(self.vector, i)
            param.grad = self.layout.view(self.grad, i)
        named_buffers = [(n, b) for n, b in module.named_buffers() if b.is_floating_point()]
        self.buffer_layout = ParamLayout.of(named_buffers)
        self.buffers = torch.empty(self.buffer_layout.size, dtype=torch.float32, device=device)
        owners = dict(module.named_modules())
        offsets = self.buffer_layout.offsets
        for (name, buf), start, stop in zip(named_buffers, offsets[:-1], offsets[1:]):
            self.buffers[start:stop].copy_(buf.reshape(-1))
            owner_name, _, attr = name.rpartition(".")
            setattr(owners[owner_name], attr, self.buffers[start:stop].view(buf.shape))

    @property
    def size(self) -> int:
        return self.layout.size

    def load(self, values: np.ndarray | torch.Tensor, part: slice | None = None) -> None:
        """Copy ``values`` into the parameters (all of them, or the slice ``part``)."""
        source = to_device([values], self.vector.device)[0] if isinstance(values, np.ndarray) else values
        target = self.vector if part is None else self.vector[part]
        with torch.no_grad():
            target.copy_(source.reshape(-1))

    def numpy(self, part: slice | None = None) -> np.ndarray:
        """A float32 numpy copy of the parameters (or of the slice ``part``)."""
        return host_copy(self.vector if part is None else self.vector[part])

    def slice_of(self, prefixes: str | Sequence[str]) -> slice:
        return self.layout.slice_of(prefixes)

    def zero_grad(self) -> None:
        self.grad.zero_()

    # --- full state: parameters followed by floating-point buffers (BatchNorm statistics) -----
    @property
    def state_size(self) -> int:
        return self.layout.size + self.buffer_layout.size

    def state(self, *, copy: bool = True) -> torch.Tensor:
        """Parameters and floating-point buffers, concatenated, on the model's device: a new tensor, or
        (``copy=False``, for a caller that only reads it at once) the live parameter vector when there
        are no buffers."""
        if self.buffer_layout.size:
            return torch.cat([self.vector.detach(), self.buffers])
        return self.vector.detach().clone() if copy else self.vector.detach()

    def state_numpy(self) -> np.ndarray:
        """Parameters and floating-point buffers, concatenated, as one float32 numpy copy."""
        return host_copy(self.state(copy=False))

    def load_state(self, values: np.ndarray | torch.Tensor) -> None:
        """Load a vector produced by :meth:`state_numpy` (host values reach the device in one transfer)."""
        source = to_device([values], self.vector.device)[0] if isinstance(values, np.ndarray) else values
        p = self.layout.size
        with torch.no_grad():
            self.vector.copy_(source[:p])
            if self.buffer_layout.size:
                self.buffers.copy_(source[p:])
