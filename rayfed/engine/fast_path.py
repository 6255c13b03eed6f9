"""What of the fast path a run cannot take, said once in its log before it starts.

With ``engine.vectorize`` asking for stacks (``on``, or ``auto`` on a GPU), a worker trains a call's clients of
one architecture as one stack, unless the algorithm declares it cannot (:class:`~rayfed.algorithms.registry.
Capabilities`) or the architecture has no stacked form (:func:`~rayfed.train.stacked_layers.model_unstackable`);
those clients then train one at a time. The workers decide this per call and silently; the driver says it
here, once per run.
"""

from __future__ import annotations

import logging

import torch

from rayfed.algorithms import ResolvedAlgorithm
from rayfed.config import RunConfig
from rayfed.engine.problem_build import DataShape
from rayfed.models import build_model
from rayfed.train.stacked_layers import model_unstackable

logger = logging.getLogger(__name__)

__all__ = ["slow_paths", "log_slow_paths"]


def slow_paths(config: RunConfig, algorithm: ResolvedAlgorithm, data: DataShape) -> list[str]:
    """One line per part of the run that trains one client at a time although ``engine.vectorize`` asks for
    stacks (none where it does not ask), and per algorithm that declares it replays no CUDA graphs."""
    engine = config.engine
    if engine.vectorize == "off" or (engine.vectorize == "auto" and engine.num_gpus_per_worker == 0):
        return []
    capabilities = algorithm.capabilities
    lines = []
    if not capabilities.stacks:
        lines.append(
            f"algorithm {algorithm.client_algorithm.name!r} trains its clients one at a time "
            f"(engine.vectorize={engine.vectorize!r} does not apply): {capabilities.reason}"
        )
    elif not capabilities.replays and engine.cuda_graphs:
        lines.append(
            f"algorithm {algorithm.client_algorithm.name!r} replays no CUDA graphs "
            f"(engine.cuda_graphs does not apply): {capabilities.reason}"
        )
    if capabilities.stacks:
        for architecture in config.model.architectures():
            with torch.device("meta"):
                module = build_model(architecture, data.input_shape, data.num_classes)
            reason = model_unstackable(architecture, module, config.train.drop_last)
            if reason:
                lines.append(
                    f"clients of model {architecture!r} train one at a time "
                    f"(engine.vectorize={engine.vectorize!r} does not apply to them): {reason}"
                )
    return lines


def log_slow_paths(config: RunConfig, algorithm: ResolvedAlgorithm, data: DataShape) -> None:
    """Log :func:`slow_paths`, each line once."""
    for line in slow_paths(config, algorithm, data):
        logger.warning(line)
