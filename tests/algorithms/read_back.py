"""What a worker's call reads back from the device once a client has uploaded (:mod:`rayfed.execution.settlement`):
the upload's tensors and the tensors the client put into its state, as host arrays."""

from __future__ import annotations

from typing import TypeVar

import torch

from rayfed.algorithms import Contribution
from rayfed.algorithms.contributions import WeightedState
from rayfed.train.host import to_host
from rayfed.train.job import ClientJob

__all__ = ["settled"]

C = TypeVar("C", bound=Contribution)


def settled(contribution: C | WeightedState, *jobs: ClientJob) -> C:
    """``contribution`` (a declared weighted state made from the first job's trained model) with its tensors read
    back, and each of ``jobs``' states with its tensors read back, in place (as the call's settlement does)."""
    if isinstance(contribution, WeightedState):
        contribution = contribution.of_one(jobs[0].trained, jobs[0].num_train)  # type: ignore[assignment]
    for job in jobs:
        if job.state:
            keys = [key for key, value in job.state.items() if isinstance(value, torch.Tensor)]
            for key, array in zip(keys, to_host([job.state[key] for key in keys])):
                job.state[key] = array
    return contribution.with_host_arrays(to_host(contribution.device_tensors()))  # type: ignore[return-value]
