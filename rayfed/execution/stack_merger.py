"""Runs that share a model share one stack: a merger of the concurrent stacked training calls of several runs.

Several runs in one process (:func:`rayfed.run_many`), each in a thread of its own with its whole driver (sampling,
server, checkpoints, run directory, trackers), hand the stacks their workers form to one :class:`StackMerger`, as a
serving system batches requests. Each run's thread holds the merger's baton while it runs and lets it go only while
it waits for a stack, so the runs take turns on the process (nothing of torch's global state is shared between
two runs at once). Once every run still running waits on a stack, the stacks that may train as one
(:func:`merge_key`: one architecture and layout, one local-training configuration but for the learning rate, phases
whose :func:`~rayfed.train.stacking.stack_key` agree once each run's client half is seen through its class and
hyper-parameters) train as one stack of all their clients, and each run gets its own clients' rows back. A run that
ends, fails or is stopped leaves the merger and is no longer waited for.

What runs may differ in, lane by lane: their seeds and data (each client's own samples and generator), their
starting models (each run's broadcast), the learning rate (:func:`~rayfed.train.stacked.lane_rates`), and the
hyper-parameters a method's loss reads (WDR's coefficient, FedProx's mu): where the runs' client halves differ in
them, the merged stack's loss is :class:`_SelectedLoss`, every lane computing each half's loss and keeping its own run's
(1 · its own + 0 · the others', exactly its own while the others' are finite). A merged stack that raises trains
again one run at a time (each run's generators restored), so that the error reaches only the run that made it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import threading
import types
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from rayfed.config import EngineConfig
from rayfed.train.job import ClientJob
from rayfed.train.loop import LocalLoop, Trained
from rayfed.train.phase import Adam, Batch, Constants, Outputs, Params, Phase
from rayfed.train.stacking import stack_key

__all__ = ["StackMerger", "current_merger", "training_backend", "merge_key", "HALF"]

logger = logging.getLogger(__name__)

HALF = "#half"
"""The constant of a merged stack's lanes that selects their run's loss: a one-hot row over the distinct losses."""
_HOOKS = ("loss", "forward", "on_train_batch_start", "on_after_backward", "on_train_end")
_KEY_PARTS = (
    "architecture",
    "model class",
    "parameter layout",
    "state size",
    "device",
    "local-training configuration",
    "learning rate (a stack of Adam or of a method's own trainables has one)",
    "output layers",
    "phases (their steps, optimizer or hooks)",
)
"""What each element of :func:`merge_key` is, in words: the reason a log gives for two runs' stacks apart."""
_merger: contextvars.ContextVar[StackMerger | None] = contextvars.ContextVar("rayfed_stack_merger", default=None)


def current_merger() -> StackMerger | None:
    """The merger the runs of this thread's :func:`rayfed.run_many` share, None for a run of its own."""
    return _merger.get()


def training_backend(engine: EngineConfig) -> str:
    """Where a run of ``engine`` trains its clients from this thread: ``engine.backend``, but ``"local"`` (in this
    process) for a run packed with others (its thread has a merger), whose stacks meet the pack's here. On Ray that
    process is the pack's host (:mod:`rayfed.actors.pack_host`), which Ray placed with one worker's resources: a run
    of ``engine.backend="ray"`` trains there in-process, its config (and all it records) unchanged, since the local
    backend and Ray give a run the same numbers (:mod:`rayfed.execution.executor`). The one place where a run
    trains elsewhere than its backend says (docs/architecture.md, "Runs that share one stack")."""
    return "local" if current_merger() is not None else engine.backend


def _half_key(hook: Any, *, with_params: bool) -> Hashable:
    """What makes two runs' hooks one: a client half's method, by its function, the half's class and (unless the
    merged loss selects each lane's own) its hyper-parameters; any other function, itself."""
    if isinstance(hook, types.MethodType):
        owner = hook.__self__
        params = repr(getattr(owner, "params", None)) if with_params else None
        return (hook.__func__, type(owner), params)
    return ("own", id(hook))


class _Canon:
    """One representative of every run-neutral hook (:func:`_half_key`), the first seen."""

    def __init__(self) -> None:
        self.held: dict[Hashable, Any] = {}
        self.selected: dict[tuple[Hashable, ...], _SelectedLoss] = {}
        """One selecting loss per set of distinct losses, so that a merged stack's key stays from round to round
        (its workspace and captured steps are kept)."""

    def of(self, hook: Any, *, with_params: bool = True) -> Any:
        if hook is None or not isinstance(hook, types.MethodType):
            return hook
        return self.held.setdefault(_half_key(hook, with_params=with_params), hook)

    def phase(self, phase: Phase) -> Phase:
        """``phase`` with each hook its representative (the loss one of its class, whatever its parameters)."""
        hooks = {name: self.of(getattr(phase, name), with_params=name != "loss") for name in _HOOKS}
        return dataclasses.replace(phase, **hooks)


def merge_key(
    loop: LocalLoop, jobs: Sequence[ClientJob], phases: Sequence[Sequence[Phase]], canon: _Canon
) -> tuple[Any, ...]:
    """What must agree for two runs' stacks to train as one (module docstring), one element per :data:`_KEY_PARTS`."""
    job, flat = jobs[0], jobs[0].flat
    train = dataclasses.replace(job.train, lr=1.0, lr_decay=1.0, rounds=1)
    own = phases[0]
    # Adam's scalars and a trainable's default rate are one a stack: a rate per lane needs neither.
    one_rate = any(isinstance(p.optimizer, Adam) or p.extra for p in own)
    return (
        job.architecture,
        type(flat.module),
        flat.layout,
        flat.state_size,
        str(job.device),
        train,
        job.lr if one_rate else None,
        tuple(loop.output_layers.items()),
        tuple(stack_key(canon.phase(p)) for p in own),
    )


@dataclass(eq=False)
class _SelectedLoss:
    """The loss of a merged stack whose runs' client halves differ in what their losses read: each lane's own run's
    loss, ``Σ_r onehot_r · loss_r`` (one-hot ``constants[HALF]``), exactly its own where the others are finite."""

    losses: tuple[Any, ...]

    def __call__(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        weights = constants[HALF]
        total: torch.Tensor | None = None
        for index, loss in enumerate(self.losses):
            term = weights[index] * loss(out, batch, params, constants)
            total = term if total is None else total + term
        assert total is not None
        return total


@dataclass(eq=False)
class _Request:
    loop: LocalLoop
    jobs: list[ClientJob]
    starts: torch.Tensor
    phases: list[list[Phase]]
    replays: bool
    pack: bool
    key: tuple[Any, ...] = ()
    trained: Trained | None = None
    alone: bool = False
    done: bool = False


@dataclass(eq=False)
class StackMerger:
    """The stacks of the runs of one :func:`rayfed.run_many` (module docstring)."""

    live: int = 0
    """Runs that still run (each one's thread inside :meth:`turn`)."""
    merged: int = 0
    """Stacks trained with another run's (each request merged counts once): what a test reads to see runs packed."""
    _baton: threading.Condition = field(default_factory=threading.Condition)
    _count: threading.Lock = field(default_factory=threading.Lock)
    """Guards :attr:`live` apart from the baton, so that a run can be expected while another holds the baton (a
    tuner's next trial, expected while the running one trains)."""
    _pending: list[_Request] = field(default_factory=list)
    _canon: _Canon = field(default_factory=_Canon)
    _said: set[str] = field(default_factory=set)
    """The reasons already logged for stacks that waited together but trained apart (each is said once)."""

    def expect(self, runs: int) -> None:
        """Count ``runs`` more runs before any of them starts, so that none merges before all are waited for; the
        baton is not needed (a running run sees them at its next stack)."""
        with self._count:
            self.live += runs

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Run one of the expected runs in this thread: holding the baton, this merger its threads' merger; leaving
        it (however the run ends) the others no longer wait for its stacks."""
        token = _merger.set(self)
        with self._baton:
            try:
                yield
            finally:
                with self._count:
                    self.live -= 1
                _merger.reset(token)
                self._settle()

    def train_stack(
        self,
        loop: LocalLoop,
        jobs: Sequence[ClientJob],
        starts: torch.Tensor,
        phases: Sequence[Sequence[Phase]],
        *,
        replays: bool = True,
        pack: bool = False,
    ) -> Trained:
        """What :meth:`LocalLoop.train_stack` returns for ``jobs``, trained with the other runs' stacks that wait
        now where they merge (:func:`merge_key`). Called from a thread inside :meth:`turn`."""
        request = _Request(loop, list(jobs), starts, [list(p) for p in phases], replays, pack)
        request.key = merge_key(loop, request.jobs, request.phases, self._canon)
        self._pending.append(request)
        self._settle()
        while not request.done:
            self._baton.wait()
        if request.alone:
            return loop.train_stack(request.jobs, starts, request.phases, replays=replays, pack=pack)
        assert request.trained is not None
        return request.trained

    def _settle(self) -> None:
        """Once every running run waits on a stack, train the waiting stacks: those that merge as one, the others
        each by its own run (in its own thread, which the baton wakes)."""
        if not self._pending or len(self._pending) < self.live:
            return
        pending, self._pending = self._pending, []
        groups: dict[Hashable, list[_Request]] = {}
        for request in pending:
            groups.setdefault((request.key, request.replays, request.pack), []).append(request)
        if len(groups) > 1:
            self._say_apart([group[0].key for group in groups.values()])
        for group in groups.values():
            if len(group) == 1 or not self._merge(group):
                for request in group:
                    request.alone = True
        for request in pending:
            request.done = True
        self._baton.notify_all()

    def _say_apart(self, keys: list[tuple[Any, ...]]) -> None:
        """Log once, for each new reason, why stacks that waited together train in separate stacks of the call
        (their numbers are those they have alone either way)."""
        first = keys[0]
        for other in keys[1:]:
            if first == other:
                continue  # the same key: apart by their replay or lane-packing options
            part = next(name for name, a, b in zip(_KEY_PARTS, first, other) if a != b)
            if part not in self._said:
                self._said.add(part)
                logger.info("packed runs' stacks train apart where their %s differs", part)

    def _merge(self, group: list[_Request]) -> bool:
        """Train ``group``'s stacks as one and hand each its rows; False (every generator as it was) if it raised."""
        jobs = [job for request in group for job in request.jobs]
        phases = _selecting(jobs, [p for request in group for p in request.phases], self._canon)
        states = [job.generator.get_state() for job in jobs]
        try:
            starts = torch.cat([request.starts for request in group])
            first = group[0]
            trained = first.loop.train_stack(jobs, starts, phases, replays=first.replays, pack=first.pack)
        except Exception:  # noqa: BLE001 - the run whose stack raises sees its error when it trains alone
            for job, state in zip(jobs, states):
                job.generator.set_state(state)
            return False
        at = 0
        for request in group:
            rows = slice(at, at + len(request.jobs))
            request.trained = Trained(trained.states[rows], trained.losses[rows], trained.steps[rows])
            at = rows.stop
        self.merged += len(group)
        return True


def _selecting(jobs: list[ClientJob], phases: list[list[Phase]], canon: _Canon) -> list[list[Phase]]:
    """The merged stack's phases: each hook its representative, and where the runs' losses differ in their halves'
    hyper-parameters, :class:`_SelectedLoss` with each lane's one-hot row of them (on its job's device)."""
    out = [[canon.phase(p) for p in own] for own in phases]
    for index in range(len(phases[0])):
        keys = [_half_key(own[index].loss, with_params=True) for own in phases]
        distinct: dict[Hashable, Any] = {}
        for key, own in zip(keys, phases):
            distinct.setdefault(key, canon.of(own[index].loss))
        if len(distinct) < 2:
            continue
        order = list(distinct)
        selected = canon.selected.setdefault(tuple(order), _SelectedLoss(tuple(distinct.values())))
        for job, key, own in zip(jobs, keys, out):
            onehot = torch.zeros(len(order), device=job.device)
            onehot[order.index(key)] = 1.0
            constants = {**own[index].constants, HALF: onehot}
            own[index] = dataclasses.replace(own[index], loss=selected, constants=constants)
    return out
