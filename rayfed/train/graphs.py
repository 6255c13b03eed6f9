"""Replaying a training step as a CUDA graph: captured once per shape, replayed at every step.

A small model's step on a GPU costs what the host needs to issue its few hundred kernels, not what
they compute; a CUDA graph issues them all in one launch. :class:`StepGraphs` runs a *step*: a
function that reads and writes only tensors whose storage stays put from one call to the next (its
workspace, which the caller fills before each step). On CUDA the first call of a shape warms the
step up on a side stream (undoing what the warm-up changed), captures it, and every call replays
it. On a CPU the step simply runs, so the code a GPU replays is the code the CPU tests exercise.
Where a step cannot be captured (an operation that reads back to the host, say), it runs eagerly;
the first such failure is logged once per worker, with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence

import torch

logger = logging.getLogger(__name__)

__all__ = ["StepGraphs", "WARMUP_STEPS"]

WARMUP_STEPS = 3
"""Eager runs of a step on a side stream before it is captured (cuDNN picks its algorithms, the caching
allocator settles), as PyTorch's CUDA-graph recipe does; their effect on the workspace is undone."""


class StepGraphs:
    """The captured steps of one worker, by shape (:meth:`run`)."""

    def __init__(self, device: torch.device, enabled: bool = True, fixed: bool | None = None) -> None:
        self.device = device
        self.enabled = enabled and device.type == "cuda"
        self.fixed = self.enabled if fixed is None else fixed
        """Whether steps read fixed workspaces (copied into at every step), as a captured step must: where graphs
        are captured, or (``fixed=True``) on a CPU, so that the replay path's code runs where the tests run."""
        self._graphs: dict[Hashable, torch.cuda.CUDAGraph | None] = {}
        self._warned = False

    def run(self, key: Hashable | None, step: Callable[[], None], mutable: Sequence[torch.Tensor]) -> None:
        """Run ``step``: eagerly off CUDA or without a ``key`` (a workspace that will not outlive the call),
        else from the graph captured for ``key`` (captured now, the first time). ``mutable`` lists every
        workspace tensor the step changes, which the warm-up restores."""
        if not self.enabled or key is None:
            step()
            return
        if key not in self._graphs:
            self._graphs[key] = self._capture(step, mutable)
        graph = self._graphs[key]
        if graph is None:
            step()
        else:
            graph.replay()

    def _capture(self, step: Callable[[], None], mutable: Sequence[torch.Tensor]) -> torch.cuda.CUDAGraph | None:
        saved = [tensor.clone() for tensor in mutable]
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    step()
            torch.cuda.current_stream(self.device).wait_stream(side)
            _restore(mutable, saved)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            return graph
        except RuntimeError as error:  # an operation that cannot be captured: this shape runs eagerly
            torch.cuda.synchronize(self.device)
            _restore(mutable, saved)
            if not self._warned:
                logger.warning(
                    "a training step could not be captured as a CUDA graph (%s); such steps run eagerly",
                    str(error).splitlines()[0],
                )
                self._warned = True
            return None


def _restore(tensors: Sequence[torch.Tensor], saved: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for tensor, value in zip(tensors, saved):
            tensor.copy_(value)
