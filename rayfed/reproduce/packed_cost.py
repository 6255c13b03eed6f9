"""What a table costs with the runs that share a model packed into one stack: ``rayfed reproduce TABLE --plan``.

Which cells pack is :func:`rayfed.execution.run_packs.pack_runs` of their configs (the seeds of a row and column,
rows of one method that differ in floats only). What packing saves is an **estimate** from two models, each
stated where it is used:

* the lanes (:mod:`rayfed.train.lanes`): a round of runs packed lays all their clients' steps into the lanes of
  one stack (:func:`~rayfed.train.lanes.packed_lanes`, at most ``engine.stack_size`` lanes a stack, further runs in
  another stack after it); alone, each run's clients take a lane each (:func:`~rayfed.train.lanes.one_lane_each`);
* the launch-bound step (:data:`FLAT_LANES`): a small model's stacked step on a GPU costs its kernel launches, so a
  step of up to 40 lanes costs about what one of 20 costs; beyond, its cost is taken to grow with its width (as if
  arithmetic-bound: the conservative side). A round is taken to be its stacked steps (the H200's MNIST round:
  training 1.019 s of 1.109 s); the rest of it (evaluation, aggregation) stays each run's own.

A round of ``K`` runs packed then costs ``sum over its stacks of stacked_steps x step_s x max(1, lanes / 40)``,
against ``K x`` the same of each run alone; the packed horizon is each cell's hours alone times that ratio. On a
CPU the stacked path is off by default (``engine.vectorize=auto``), so nothing packs there and the CPU's figure
is the plan's own; beside it, :data:`GPU_RECORD` (the one GPU measured) prices the same runs on a GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rayfed.config import RunConfig
from rayfed.execution.run_packs import RunPacks, alone_reason, pack_runs
from rayfed.reproduce.runner import Cell
from rayfed.train.lanes import one_lane_each, packed_lanes

__all__ = [
    "FLAT_LANES",
    "GpuRecord",
    "GPU_RECORD",
    "step_factor",
    "round_steps",
    "alone_steps",
    "pack_ratio",
    "shape_ratios",
    "on_gpu",
    "cells_line",
]

FLAT_LANES = 40
"""Lanes up to which a stacked step of a small model costs about the same on a GPU (launch-bound:
benchmarks/README.md, "a stacked step of 40 lanes costs about what one of 20 costs")."""


@dataclass(frozen=True)
class GpuRecord:
    """A round measured on a GPU, alone: what prices a plan's runs on a GPU from a machine without one."""

    device: str
    date: str
    model: str
    round_s: float
    train_s: float
    stacked_steps: int
    lanes: int
    protocol: str

    @property
    def step_s(self) -> float:
        """Seconds of one stacked step of at most :data:`FLAT_LANES` lanes."""
        return self.train_s / (self.stacked_steps * step_factor(self.lanes))

    @property
    def other_s(self) -> float:
        """Seconds of a round beside its training steps (evaluation, aggregation, the driver)."""
        return self.round_s - self.train_s

    def describe(self) -> str:
        return f"{self.device}, {self.date}: {self.round_s:.3f} s a round of {self.protocol} alone"


GPU_RECORD = GpuRecord(
    device="NVIDIA H200",
    date="2026-11-28",
    model="cnn4",
    round_s=1.109,
    train_s=1.019,
    stacked_steps=464,
    lanes=20,
    protocol="the MNIST protocol (FedAvg, cnn4, 20 clients, Dirichlet 0.1, 5,240 steps; benchmarks/README.md)",
)
"""The GPU round recorded in benchmarks/README.md ("The GPU path (NVIDIA H200)")."""


_LANES_MODEL = (
    f"a step of up to {FLAT_LANES} lanes costing the same (launch-bound, whatever the input size) and more in "
    "proportion to its width beyond, and the runs' clients laid into lanes as rayfed.train.lanes packs them"
)


def step_factor(lanes: int) -> float:
    """A stacked step's cost of ``lanes`` lanes over one of at most :data:`FLAT_LANES` (module docstring)."""
    return max(1.0, lanes / FLAT_LANES)


@functools.lru_cache(maxsize=4096)
def _packed(steps: tuple[int, ...]) -> tuple[int, int]:
    lanes = packed_lanes(steps)
    return len(lanes.clients), lanes.stacked_steps


def round_steps(runs: Sequence[Sequence[int]], stack_size: int) -> float:
    """A round of ``runs`` (each its clients' step counts) packed, in stacked steps of at most
    :data:`FLAT_LANES` lanes: the runs in order, each into the current stack while its lanes stay within
    ``stack_size``, else into a new stack after it."""
    total = 0.0
    stack: tuple[int, ...] = ()
    for steps in runs:
        grown = tuple(sorted(stack + tuple(steps), reverse=True))
        if stack and _packed(grown)[0] > stack_size:
            total += _cost(stack)
            grown = tuple(sorted(steps, reverse=True))
        stack = grown
    return total + (_cost(stack) if stack else 0.0)


def _cost(steps: tuple[int, ...]) -> float:
    lanes, stacked = _packed(steps)
    return stacked * step_factor(lanes)


def alone_steps(steps: Sequence[int]) -> float:
    """A round of one run alone, in stacked steps of at most :data:`FLAT_LANES` lanes: a lane a client."""
    lanes = one_lane_each(steps)
    return lanes.stacked_steps * step_factor(len(lanes.clients))


def pack_ratio(runs: Sequence[Sequence[int]], stack_size: int) -> float:
    """A packed round's stacked-step cost over the runs' rounds alone, one after another (1: packing saves nothing)."""
    alone = sum(alone_steps(steps) for steps in runs)
    return round_steps(runs, stack_size) / alone if alone else 1.0


def shape_ratios(
    configs: Mapping[tuple[str, str], RunConfig], steps: Mapping[tuple[str, str], Sequence[int]], seeds: int
) -> tuple[RunPacks, dict[tuple[str, str], float]]:
    """Which shapes pack (one config each, :func:`~rayfed.execution.run_packs.pack_runs`) and each shape's round cost
    packed over alone when ``seeds`` runs of every shape train: the seeds of a shape pack with each other and with
    the shapes it packs with; 1 where the stacked path is off for it, only one run would train, or its clients'
    steps are unknown."""
    shapes = list(configs)
    packs = pack_runs(list(configs.values()))
    groups = [*packs.packs, *((i,) for i in packs.alone if not alone_reason(configs[shapes[i]]))]
    ratios = dict.fromkeys(shapes, 1.0)
    for group in groups:
        runs = [steps[shapes[i]] for i in group for _ in range(seeds) if steps.get(shapes[i])]
        if len(runs) > 1 and len(runs) == len(group) * seeds:
            ratio = pack_ratio(runs, configs[shapes[group[0]]].engine.stack_size)
            ratios.update({shapes[i]: ratio for i in group})
    return packs, ratios


def on_gpu(config: RunConfig) -> RunConfig:
    """``config`` as it would run on a GPU: with a GPU share where it has none and leaves the stacked path to the
    device (``engine.vectorize=auto``)."""
    if config.engine.num_gpus_per_worker > 0 or config.engine.vectorize != "auto":
        return config
    return config.override({"engine.num_gpus_per_worker": 1.0})


def cells_line(cells: Sequence[Cell], packs: RunPacks) -> str:
    """Which of ``cells`` pack together and, grouped by reason, which train alone, in one line."""
    parts = [f"packed {_named(cells, pack)}" for pack in packs.packs]
    reasons: dict[str, list[int]] = {}
    for position, why in sorted(packs.alone.items()):
        reasons.setdefault(why, []).append(position)
    parts += [f"alone ({why}): {_named(cells, members)}" for why, members in reasons.items()]
    return "; ".join(parts) or "no cells to run"


def _named(cells: Sequence[Cell], positions: Sequence[int]) -> str:
    """``row x column s0,1,2`` for each row and column among ``positions``, joined by ``+``."""
    seeds: dict[tuple[str, str], list[str]] = {}
    for i in positions:
        seeds.setdefault((cells[i].row.key, cells[i].column.key), []).append(str(cells[i].seed))
    return " + ".join(f"{row} x {column} s{','.join(found)}" for (row, column), found in seeds.items())


def packing_lines(
    cells: Sequence[Cell],
    steps: Mapping[tuple[str, str], Sequence[int]],
    hours_here: Mapping[tuple[str, str], float],
    *,
    paper_rounds: int,
    paper_seeds: int,
) -> tuple[list[str], dict[str, float]]:
    """The ``--plan`` lines on packing: which cells pack here (and, on a machine where the stacked path is off,
    on a GPU), the papers' horizon packed on this device, and, where nothing packs here, the GPU estimate from
    :data:`GPU_RECORD`; with their ``key=value`` fields. ``hours_here``: each costed shape's run at the horizon
    from scratch on this device, alone; ``steps``: its clients' step counts in a round, where known."""
    runnable = [cell for cell in cells if cell.config is not None]
    here = pack_runs([cell.config for cell in runnable if cell.config is not None])
    lines = [f"packs here: {cells_line(runnable, here)}"]
    first = {(cell.row.key, cell.column.key): cell.config for cell in reversed(runnable)}
    configs = {shape: config for shape, config in first.items() if shape in hours_here and config is not None}
    _, ratios = shape_ratios(configs, steps, paper_seeds)
    alone = sum(hours_here.values()) * paper_seeds
    packed = sum(hours * ratios[shape] for shape, hours in hours_here.items()) * paper_seeds
    fields = {"paper_packed_hours": packed}
    if here.packs or not here.alone:
        lines += [
            f"the papers' horizon packed here: {packed:,.1f} device-hours of runs against {alone:,.1f} alone",
            f"  an estimate: it assumes the round timed here is its stacked steps, {_LANES_MODEL}",
        ]
        return lines, fields
    gpu = pack_runs([on_gpu(cell.config) for cell in runnable if cell.config is not None])
    lines += [
        f"the papers' horizon here: {alone:,.1f} hours of runs, nothing packed (the stacked path is off here)",
        f"on a GPU: {cells_line(runnable, gpu)}",
    ]
    estimate, known = _gpu_estimate(configs, steps, paper_rounds, paper_seeds)
    fields |= {"gpu_estimate_hours": estimate[1], "gpu_estimate_alone_hours": estimate[0]}
    unknown = ", ".join(" x ".join(shape) for shape in sorted(set(configs) - set(known)))
    lines += [
        f"GPU estimate from {GPU_RECORD.describe()}: {estimate[1]:,.1f} GPU-hours packed, {estimate[0]:,.1f} alone, "
        f"for {len(known)} of the {len(configs)} costed shapes"
        + (f" (not estimated, another model or its steps unknown: {unknown})" if unknown else ""),
        f"  an estimate: it assumes a round is its stacked steps, {GPU_RECORD.step_s * 1e3:.2f} ms each, plus "
        f"{GPU_RECORD.other_s:.3f} s a run-round beside them (evaluation, aggregation), {_LANES_MODEL}",
    ]
    return lines, fields


def _gpu_estimate(
    configs: Mapping[tuple[str, str], RunConfig],
    steps: Mapping[tuple[str, str], Sequence[int]],
    paper_rounds: int,
    paper_seeds: int,
) -> tuple[tuple[float, float], list[tuple[str, str]]]:
    """(GPU-hours alone, packed) of the horizon for the shapes of :data:`GPU_RECORD`'s model whose steps are known,
    and those shapes."""
    known = {s: on_gpu(c) for s, c in configs.items() if steps.get(s) and c.model.name == GPU_RECORD.model}
    _, ratios = shape_ratios(known, steps, paper_seeds)
    alone = {s: alone_steps(steps[s]) * GPU_RECORD.step_s + GPU_RECORD.other_s for s in known}
    packed = {s: alone_steps(steps[s]) * GPU_RECORD.step_s * ratios[s] + GPU_RECORD.other_s for s in known}
    hours = paper_rounds * paper_seeds / 3600
    return (sum(alone.values()) * hours, sum(packed.values()) * hours), list(known)
