"""The GPU path's CPU proxies hold: per step, no more ATen operations than a plain PyTorch loop (sequential),
at most twice a plain step's for a stack of 20 clients, at most one host sync per call, and no gradient added into
a ``.grad`` by the sequential step (``benchmarks/step_overhead.py``, whose workload this runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from step_overhead import count, plain_call, rayfed_call  # noqa: E402


def test_steps_issue_no_more_operations_than_a_plain_loop_and_read_nothing_back() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plain = count(plain_call(20, 50))
        sequential = count(rayfed_call(20, 50, "off"))
        stacked = count(rayfed_call(20, 50, "on"))
    finally:
        torch.set_num_threads(threads)
    plain_per_step = plain.ops / plain.client_steps
    assert sequential.client_steps == stacked.client_steps == plain.client_steps == 100
    assert sequential.ops / sequential.client_steps <= plain_per_step
    assert stacked.ops / (stacked.client_steps / 20) <= 2 * plain_per_step
    assert sequential.syncs <= 1 and stacked.syncs <= 1  # one transfer per call: 0.01 per client-step
    assert sequential.accumulations == 0  # each gradient goes from backward to its update, never into a .grad
    assert plain.accumulations > 0  # the count sees the accumulations of a plain backward
