"""``rayfed check METHOD`` and :func:`check`: a method run for two rounds on tiny data, stacked and one client at a
time, on the CPU, and what a method author needs to know of it in a few lines.

On a CPU, ``engine.vectorize=auto`` trains one client at a time, so a loss that reads a value back to the host
(``.item()``) or that differs per client passes on a laptop and fails, or splits into stacks of one, on a GPU. The
check trains every round twice from the same message and states, with ``engine.vectorize=off`` and ``on``
(:class:`TwoPaths`), and reports whether the clients stacked, whether both paths give the same losses, uploads and
states (:mod:`rayfed.checking.path_comparison`), the bytes a client uploads and downloads, and every mistake with its
fix: the phase checker's (:mod:`rayfed.train.phase_checks`), a config the method refuses, or what a stack's
``torch.func.vmap`` refuses in a hook (``.item()``, a shape that depends on the data, a Python branch on a tensor,
random numbers), named by the hook and the line that did it. It writes nothing.
"""

from __future__ import annotations

import math
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rayfed.algorithms import resolve
from rayfed.algorithms.hooks import message_bytes
from rayfed.checking.method_mistakes import explain
from rayfed.checking.path_comparison import largest_loss_difference, path_differences
from rayfed.config import RunConfig
from rayfed.engine.inputs import RunInputs
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.reports import TrainResult
from rayfed.execution.round_facts import RoundFacts
from rayfed.execution.server import Server
from rayfed.train.job import ClientJob
from rayfed.train.loop import LocalLoop
from rayfed.train.phase import Phase
from rayfed.train.stacked_layers import model_unstackable
from rayfed.train.stacking import split_reason
from rayfed.util.errors import ConfigError

__all__ = ["CheckReport", "TwoPaths", "check_config", "check", "methods_in"]


def check_config(
    method: str, overrides: Mapping[str, Any] | None = None, *, rounds: int = 2, clients: int = 8
) -> RunConfig:
    """The check's run of ``method``: ``clients`` clients of 60 synthetic 1x28x28 images each (Dirichlet 1.0, cnn4),
    batches of 8, in this process, on the CPU, all of a call's clients in one stack; ``overrides`` on top (what the
    method needs: its own network, a smaller public set)."""
    return RunConfig().override(
        {
            "data.dataset": "synthetic",
            "data.options": {"num_samples": 60 * clients},
            "data.num_clients": clients,
            "data.partition": "dirichlet",
            "data.alpha": 1.0,
            "model.name": "cnn4",
            "algorithm.name": method,
            "train.rounds": rounds,
            "train.batch_size": 8,
            "train.lr": 0.005,
            "engine.backend": "local",
            "engine.progress": False,
            "engine.stack_size": clients,
            "engine.torch_threads": 1,
            "engine.num_gpus_per_worker": 0.0,
            **(overrides or {}),
        }
    )


class _Recording:
    """A worker's loop that notes how it trained each call's clients: their stacks' sizes and their phases (a
    stack of one: a client trained alone)."""

    def __init__(self, loop: LocalLoop) -> None:
        self._loop = loop
        self.stacks: list[int] = []
        self.phases: list[list[Phase]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)

    def train_one(self, job: ClientJob, phases: Sequence[Phase], **options: Any) -> Any:
        self.stacks.append(1)
        self.phases.append(list(phases))
        return self._loop.train_one(job, phases, **options)

    def train_stack(
        self, jobs: Sequence[ClientJob], starts: torch.Tensor, phases: Sequence[Sequence[Phase]], **options: Any
    ) -> Any:
        self.stacks.append(len(jobs))
        self.phases.extend(list(p) for p in phases)
        return self._loop.train_stack(jobs, starts, phases, **options)


class TwoPaths:
    """One run's clients trained round by round one at a time (``engine.vectorize=off``) and stacked (``on``) from
    the same message and states; the one-at-a-time results carry the run on (its server aggregates them)."""

    def __init__(self, config: RunConfig, run_dir: Path) -> None:
        one = config.override({"engine.vectorize": "off"})
        inputs = RunInputs.prepare(one, resolve(one.algorithm), run_dir, continues=False)  # writes nothing
        spec = inputs.spec.for_clients()
        self.config = config
        self.sequential = ClientRunner(one, spec, inputs.dataset, inputs.partition)
        self.stacked = ClientRunner(config.override({"engine.vectorize": "on"}), spec, inputs.dataset, inputs.partition)
        self.recording = _Recording(self.stacked.loop)
        self.stacked.loop = self.recording  # type: ignore[assignment]
        self.alone = _Recording(self.sequential.loop)
        self.sequential.loop = self.alone  # type: ignore[assignment]
        self.server = Server(one, inputs.spec, inputs.initial)
        self.states: dict[int, Any] = {}
        self.message_bytes = 0

    def round(self, t: int, train: Callable[..., TrainResult] | None = None) -> tuple[TrainResult, TrainResult]:
        """Round ``t`` of every client on both paths; ``train(runner, *args)`` trains a call (by default
        ``runner.train(*args)``: a test profiles it)."""
        clients = self.config.data.num_clients
        ctx = RoundFacts(round=t, seed=self.config.seed, lr=self.config.train.lr_at(t), sampled=np.arange(clients))
        message = self.server.broadcast()
        self.message_bytes = message_bytes(message)
        call = train or (lambda runner, *args: runner.train(*args))
        args = (message, ctx, list(range(clients)), self.states)
        one = call(self.sequential, *args)
        other = call(self.stacked, *args)
        self.states.update(one.states)
        self.server.aggregate(ctx, one.contribution)
        return one, other

    def stack_note(self) -> str:
        """Why the stacked path did not train every call's clients in one stack (the method's declaration, its
        model, or its clients' phases), or "" when it did."""
        clients = self.config.data.num_clients
        sizes = self.recording.stacks
        if all(size == clients for size in sizes):
            return ""
        capabilities = self.stacked.capabilities
        if not capabilities.stacks:
            return f"the method declares it cannot: {capabilities.reason}"
        architecture = self.stacked.spec.architecture_of(0)
        module = self.stacked.model_for(architecture).module
        if reason := model_unstackable(architecture, module, self.config.train.drop_last):
            return f"its model {architecture!r} has no stacked form: {reason}"
        reason = split_reason(self.recording.phases[:clients])  # the first round's clients
        return f"its clients train in stacks of {sorted(set(sizes))}, not {clients}: {reason}"


@dataclass
class CheckReport:
    """What :func:`check` found of a method (``str()``: the few lines ``rayfed check`` prints)."""

    method: str
    rounds: int
    clients: int
    device: str = "cpu"
    stacks: bool = False
    """Every call's clients trained in one stack."""
    stack_note: str = ""
    """Why they did not (the method's declaration, its model, or its phases), "" when they did."""
    equal: bool = False
    """Both paths gave the same losses, uploads and states (within float rounding grown by training)."""
    loss_difference: float = math.nan
    """The largest relative difference of a client's loss between the two paths."""
    differences: list[str] = field(default_factory=list)
    bytes_up: int = 0
    """The most bytes a client uploaded in a round."""
    bytes_down: int = 0
    """The most bytes a client downloaded in a round."""
    message_bytes: int = 0
    """The bytes of the last round's message."""
    mistakes: list[str] = field(default_factory=list)
    """Every mistake found, each with its fix."""

    @property
    def ok(self) -> bool:
        """It stacks, both paths agree, and nothing is wrong."""
        return self.stacks and self.equal and not self.mistakes

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        head = f"rayfed check {self.method}: {self.rounds} rounds of {self.clients} clients, stacked and one at a time"
        lines = [f"{head}, on the {self.device.upper() if self.device != 'cpu' else 'CPU'}"]
        if self.mistakes:
            return [*lines, *(f"  mistake: {m}" for m in self.mistakes)]
        lines.append(
            f"  stacks: {'yes' if self.stacks else 'no'}" + (f" ({self.stack_note})" if self.stack_note else "")
        )
        agree = f"equal (largest relative difference {self.loss_difference:.2g})" if self.equal else "they differ"
        lines.append(f"  losses, uploads and states stacked and one at a time: {agree}")
        lines.extend(f"    {d}" for d in self.differences[:5])
        lines.append(
            f"  upload: {self.bytes_up:,} bytes a client; download: {self.bytes_down:,} bytes a client "
            f"(the message: {self.message_bytes:,} bytes)"
        )
        return lines


def check(
    method: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    rounds: int = 2,
    clients: int = 8,
) -> CheckReport:
    """Run ``method`` (a registered name; register yours first, or name its file in ``plugins``) for ``rounds``
    rounds of ``clients`` clients on tiny data (:func:`check_config`, ``overrides`` on top), stacked and one client
    at a time, and report what was found (:class:`CheckReport`; ``print(report)`` shows it in a few lines)."""
    report = CheckReport(method, rounds, clients)
    paths: TwoPaths | None = None
    try:
        config = check_config(method, overrides, rounds=rounds, clients=clients)
        with tempfile.TemporaryDirectory(prefix="rayfed-check-") as tmp:
            paths = TwoPaths(config, Path(tmp))
            report.device = paths.stacked.device.type
            losses = []
            for t in range(rounds):
                one, other = paths.round(t)
                report.differences.extend(f"round {t}: {d}" for d in path_differences(one, other))
                losses.append(largest_loss_difference(one, other))
                report.bytes_up = max([report.bytes_up, *(r.bytes_up for r in one.reports)])
                report.bytes_down = max([report.bytes_down, *(r.bytes_down for r in one.reports)])
            report.loss_difference = max(losses, default=math.nan)
            report.message_bytes = paths.message_bytes
            report.stack_note = paths.stack_note()
            report.stacks = not report.stack_note
            report.equal = not report.differences
    except Exception as error:  # noqa: BLE001 (the method's own code raised: reported with its fix and its line)
        phases = [*paths.alone.phases, *paths.recording.phases] if paths is not None else []
        report.mistakes.append(explain(method, error, phases))
    return report


def methods_in(path: str) -> list[str]:
    """The algorithms the ``.py`` file at ``path`` registers, imported as a plugin (:mod:`rayfed.util.plugins`)."""
    from rayfed.algorithms import ALGORITHMS
    from rayfed.util.plugin_sources import import_plugins

    import_plugins([path], field="METHOD")
    target = Path(path).resolve()
    found = []
    for name, (_, origin) in ALGORITHMS.registered().items():
        file = getattr(sys.modules.get(origin), "__file__", None)
        if file is not None and Path(file).resolve() == target:
            found.append(name)
    if not found:
        raise ConfigError(f"METHOD={path!r} registers no algorithm; call register_algorithm(...) at its bottom")
    return found
