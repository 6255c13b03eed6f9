"""Which runs may share one stack, from their configs alone: :func:`pack_runs`.

Runs share a stack when their clients' training steps are the same computation on different values: the same
model, the same sample shapes, the same batches and local epochs, the same method with the same structure. What
may differ is numbers that a lane carries as its own value: the seed (its sampling, initial model and batches),
the partition of the data over clients (the clients' step counts, which lanes absorb: :mod:`rayfed.train.lanes`),
the learning rate and its decay, the rounds (a run may end before the others), and a method's float
hyper-parameters (WDR's lambda, FedProx's mu, a server learning rate). Everything else is the *pack key*
(:func:`pack_key`); configs of one key form a pack.

A run trains alone where the stacked path does not apply to it (on either backend: a pack of ``engine.backend="ray"``
runs is one Ray task, :mod:`rayfed.actors.pack_host`): ``engine.vectorize=off``, ``auto`` on the CPU (stacking does
not pay there, so the CPU keeps today's speed; :func:`~rayfed.execution.devices.stacks_on`, which the worker asks of
its own device, asked of the device the config names), or a method whose client half declares it cannot
stack (:class:`~rayfed.algorithms.registry.Capabilities`, the decision ``engine/fast_path`` logs); or where no other
run shares its key, and then the first field in which it differs from the largest pack is named.

This is the decision from configs, made before anything runs. Inside a call, the worker still stacks only clients
whose phases are equal in everything but their values (:func:`rayfed.train.stacking.stack_key`, which also
compares the hooks a method makes): runs packed here whose phases do not stack train in separate stacks of the
same call, with the numbers they have alone, and the merger logs once what differs
(:class:`~rayfed.execution.stack_merger.StackMerger`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayfed.algorithms.settings import resolve
from rayfed.config import RunConfig
from rayfed.execution.devices import local_device, stacks_on

__all__ = ["RunPacks", "pack_key", "alone_reason", "pack_runs"]

_OWN_NUMBERS = {
    "data": {
        "root",
        "download",
        "num_clients",
        "partition",
        "alpha",
        "classes_per_client",
        "min_samples",
        "balance",
        "samples_per_client",
        "seed",
    },
    "train": {"lr", "lr_decay", "rounds"},
    "engine": {"progress", "loggers", "checkpoint_every", "eval_every", "max_retries", "round_timeout_s"},
}
"""Per section, the fields a lane carries as its run's own (how many samples each client has, its learning rate,
when it evaluates and writes): they do not change the shape of a stacked step. The top-level ``seed`` and
``run_dir`` are a run's own too (the key reads only the sections)."""
_SECTIONS = ("model", "data", "train", "algorithm", "engine", "system", "privacy", "plugins")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


def _method_structure(section: Mapping[str, Any]) -> dict[str, Any]:
    """An algorithm section without its float hyper-parameters (per-run numbers), names and other params kept."""
    kept = dict(section)
    for part in ("params", "client_params"):
        params = section.get(part) or {}
        kept[part] = {k: v for k, v in params.items() if not isinstance(v, float)}
    return kept


def pack_key(config: RunConfig) -> tuple[tuple[str, str], ...]:
    """(field, value) pairs that must be equal for two runs to share a stack (module docstring), in the order the
    reason a run trains alone names them: model, data, train, algorithm, engine, system, privacy, plugins."""
    tree = config.to_dict()
    key: list[tuple[str, str]] = []
    for section in _SECTIONS:
        value = tree[section]
        if section == "algorithm":
            value = _method_structure(value)
        if isinstance(value, Mapping):
            own = _OWN_NUMBERS.get(section, set())
            key += [(f"{section}.{name}", _canonical(v)) for name, v in sorted(value.items()) if name not in own]
        else:
            key.append((section, _canonical(value)))
    return tuple(key)


def alone_reason(config: RunConfig) -> str:
    """Why ``config``'s clients train in no shared stack whatever the other runs are ("" when they may)."""
    engine = config.engine
    device = local_device(engine)
    if not stacks_on(engine.vectorize, device):
        where = f" on the {device.upper()}, where stacking does not pay" if engine.vectorize == "auto" else ""
        return f"engine.vectorize={engine.vectorize!r} trains its clients one at a time{where}"
    capabilities = resolve(config.algorithm).capabilities
    if not capabilities.stacks:
        return f"algorithm {config.algorithm.name!r} does not stack: {capabilities.reason}"
    return ""


@dataclass(frozen=True)
class RunPacks:
    """The runs that may share a stack, and why each other one trains alone."""

    packs: tuple[tuple[int, ...], ...]
    """Positions of the configs of each pack (two or more each), largest first."""
    alone: Mapping[int, str]
    """Position of each config that trains alone -> why, in one line."""

    def line(self, names: Sequence[str]) -> str:
        """The log's one line: each pack and each run alone with its reason, by the names of the configs."""
        parts = [f"packed {' + '.join(names[i] for i in pack)}" for pack in self.packs]
        parts += [f"{names[i]} alone ({why})" for i, why in sorted(self.alone.items())]
        return "; ".join(parts) or "no runs"


def _first_difference(key: Sequence[tuple[str, str]], other: Sequence[tuple[str, str]], whose: str) -> str:
    """The first field of ``key`` whose value ``other`` (the key of ``whose``) does not share, in words."""
    if key == other:
        return "no other run shares its model, data shapes, steps and method"
    theirs = dict(other)
    field, value = next((f, v) for f, v in key if theirs.get(f) != v)
    return f"its {field}={value}, not {theirs.get(field, 'unset')} as in {whose}"


def pack_runs(configs: Sequence[RunConfig]) -> RunPacks:
    """Group ``configs`` into packs that may share one stack (:func:`pack_key`), each config alone where
    :func:`alone_reason` says so or no other config shares its key (the first field that differs is named)."""
    alone: dict[int, str] = {}
    by_key: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for position, config in enumerate(configs):
        reason = alone_reason(config)
        if reason:
            alone[position] = reason
        else:
            by_key.setdefault(pack_key(config), []).append(position)
    groups = sorted(by_key.items(), key=lambda item: (-len(item[1]), item[1][0]))
    packs = tuple(tuple(members) for _, members in groups if len(members) > 1)
    whose = "the largest pack" if packs else "the first run"
    for key, members in groups:
        if len(members) == 1:
            alone[members[0]] = _first_difference(key, groups[0][0], whose)
    return RunPacks(packs, alone)
