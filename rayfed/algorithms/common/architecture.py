"""Which architectures a run has, and where a model's last blocks lie: checks and slices several
algorithms share."""

from __future__ import annotations

from collections.abc import Sequence

from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec
from rayfed.util.errors import ConfigError

__all__ = ["require_homogeneous", "sole_architecture", "trailing_blocks"]


def require_homogeneous(spec: ProblemSpec) -> str:
    """The single architecture of the run; algorithms that average whole models need one.

    A server half calls it in its ``validate``; its constructor, already validated, reads
    the architecture with :func:`sole_architecture`.
    """
    if not spec.homogeneous:
        raise ConfigError(
            f"algorithm.name={spec.algorithm or 'fedavg'!r} averages whole models and needs one architecture, but "
            f"model.client_models={sorted(spec.layouts)}; use 'fedclassavg' for heterogeneous clients"
        )
    return sole_architecture(spec)


def sole_architecture(spec: ProblemSpec) -> str:
    """The architecture of a run that :func:`require_homogeneous` accepted (the first one otherwise)."""
    return next(iter(spec.layouts))


def trailing_blocks(layout: ParamLayout, blocks: Sequence[str], count: int) -> slice:
    """The contiguous slice of ``layout`` holding the model's last ``count`` top-level ``blocks``;
    0 or ``len(blocks)`` mean the whole model. One source of truth for "the last m blocks"
    (cwFedAvg's class-wise part, the body/head split)."""
    if count in (0, len(blocks)):
        return slice(0, layout.size)
    return layout.slice_of(tuple(blocks[-count:]))
