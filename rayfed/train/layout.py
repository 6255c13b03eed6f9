"""Where each parameter of a model sits in its flat vector: :class:`ParamLayout`.

A layout is plain data (names, shapes, offsets), so the parts of rayfed that only slice
vectors (the server halves, the problem spec, the memory checks) use it without torch;
:class:`rayfed.train.flat.FlatModel` builds one from a module and binds the module's parameters
to views of one vector laid out by it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["ParamLayout"]


@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and offsets of a module's parameters inside its flat vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    """offsets[i] is where parameter i starts; offsets[-1] is the total size."""
    channels_last: tuple[bool, ...] = ()
    """Per parameter: stored in (O, H, W, I) order rather than (O, I, H, W); empty = none."""

    @classmethod
    def of(cls, named: Iterable[tuple[str, torch.Tensor]], *, channels_last: bool = False) -> ParamLayout:
        """The layout of ``named`` tensors, back to back; with ``channels_last``, every 4-D
        tensor is stored channels-last."""
        names, shapes, offsets = [], [], [0]
        for name, tensor in named:
            names.append(name)
            shapes.append(tuple(tensor.shape))
            offsets.append(offsets[-1] + tensor.numel())
        formats = tuple(channels_last and len(shape) == 4 for shape in shapes)
        return cls(tuple(names), tuple(shapes), tuple(offsets), formats if any(formats) else ())

    def view(self, vector: torch.Tensor, i: int) -> torch.Tensor:
        """Parameter ``i`` as a view into ``vector`` (its flat vector), with its shape and,
        for a channels-last one, channels-last strides.

        >>> import torch
        >>> layout = ParamLayout.of([("k", torch.zeros(2, 3, 1, 1))], channels_last=True)
        >>> layout.view(torch.arange(6.0), 0)[:, :, 0, 0].tolist()
        [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
        """
        return self._shaped(vector[..., self.offsets[i] : self.offsets[i + 1]], i)

    def views(self, vector: torch.Tensor) -> list[torch.Tensor]:
        """Every parameter as a view into ``vector`` (its flat vector, or a stack of them along the leading
        dimensions), in layout order: :meth:`view` of each, cut from the vector in one ``split``."""
        sizes = [stop - start for start, stop in zip(self.offsets[:-1], self.offsets[1:])]
        whole = vector if vector.shape[-1] == self.size else vector[..., : self.size]
        return [self._shaped(piece, i) for i, piece in enumerate(whole.split(sizes, dim=-1))]

    def stacked_views(self, stack: torch.Tensor, width: int) -> list[torch.Tensor]:
        """Every parameter of ``width`` models as a contiguous (width, *shape) view into ``stack``, a
        parameter-major stack: parameter 0 of every model, then parameter 1 of every model, ..., each
        in its logical order (so a convolution's ``width`` kernels view as one grouped kernel)."""
        sizes = [width * (stop - start) for start, stop in zip(self.offsets[:-1], self.offsets[1:])]
        return [piece.view(width, *shape) for piece, shape in zip(stack.split(sizes), self.shapes)]

    def _shaped(self, piece: torch.Tensor, i: int) -> torch.Tensor:
        """Parameter ``i``'s values ``piece`` (its part of the vector, behind any leading dimensions) in its shape."""
        lead, shape = piece.shape[:-1], self.shapes[i]
        if self.channels_last and self.channels_last[i]:
            o, c, h, w = shape
            n = len(lead)
            return piece.view(*lead, o, h, w, c).permute(*range(n), n, n + 3, n + 1, n + 2)
        return piece.view(*lead, *shape)

    def flatten(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """The inverse of :meth:`views`: one tensor per parameter, in its logical shape, as a vector laid out as
        this layout lays it out (channels-last kernels stored (O, H, W, I))."""
        import torch  # only the workers call this; the server uses layouts without torch

        return torch.cat(
            [
                (t.permute(0, 2, 3, 1) if self.channels_last and self.channels_last[i] else t).reshape(-1)
                for i, t in enumerate(tensors)
            ]
        )

    @property
    def size(self) -> int:
        return self.offsets[-1]

    def slice_of(self, prefixes: str | Sequence[str]) -> slice:
        """The contiguous slice covering every parameter whose name starts with a prefix.

        A prefix ``"fc"`` matches ``fc.weight`` and ``fc.bias`` but not ``fc2.weight``.
        The matched parameters must be adjacent in the layout (true for whole
        modules and for runs of consecutive top-level blocks).
        """
        prefixes = (prefixes,) if isinstance(prefixes, str) else tuple(prefixes)
        hits = [i for i, n in enumerate(self.names) if any(n == p or n.startswith(p + ".") for p in prefixes)]
        if not hits:
            raise KeyError(f"no parameter starts with {prefixes}; parameters: {', '.join(self.names)}")
        if hits != list(range(hits[0], hits[-1] + 1)):
            raise ValueError(f"parameters of {prefixes} are not contiguous in the layout")
        return slice(self.offsets[hits[0]], self.offsets[hits[-1] + 1])

    def index(self, name: str) -> slice:
        """The slice of one parameter tensor, by its full name."""
        i = self.names.index(name)
        return slice(self.offsets[i], self.offsets[i + 1])
