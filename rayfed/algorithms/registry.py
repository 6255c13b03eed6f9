"""The algorithm registry: each algorithm module registers its two halves by name; a run's ``algorithm.*``
config resolves into a :class:`ResolvedAlgorithm` (:func:`rayfed.algorithms.settings.resolve`), the halves every
process builds.

Each algorithm module calls :func:`register_algorithm` at its bottom; the registry finds the
modules itself (:func:`_import_algorithms`), so adding an algorithm is adding one module.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rayfed.algorithms.borrowed import BorrowedTraining
from rayfed.algorithms.declarations import FastPathLimits, held_out_request
from rayfed.algorithms.hooks import ClientHalf, ServerHalf
from rayfed.algorithms.sizing import sizes_of
from rayfed.train.problem import ProblemSpec
from rayfed.util.registry import Registry, caller_module

if TYPE_CHECKING:
    from rayfed.algorithms.figures import Figure, FinishedRun
    from rayfed.data.held_out import HeldOutRequest
    from rayfed.train.settings import TrainConfig

__all__ = ["Capabilities", "Reporting", "Algorithm", "ALGORITHMS", "register_algorithm", "ResolvedAlgorithm"]


@dataclass(frozen=True)
class Capabilities:
    """What the fast path may do with an algorithm's clients: train a call's clients as one stack
    (:mod:`rayfed.train.stacked`), and replay their steps from CUDA graphs. Every method trains through the one
    loop, so both hold unless its client half declares otherwise
    (:class:`~rayfed.algorithms.declarations.FastPathLimits`: nothing inspects its code); ``reason`` then says why
    (``rayfed list METHOD`` shows it, and a run logs it once)."""

    stacks: bool = True
    replays: bool = True
    reason: str = ""

    def __post_init__(self) -> None:
        if (not self.stacks or not self.replays) and not self.reason:
            raise ValueError("an algorithm that cannot stack or replay must say why (Capabilities.reason)")

    @classmethod
    def of(cls, client_half: type) -> Capabilities:
        """What ``client_half`` allows: all of it, unless it declares :class:`FastPathLimits`."""
        if not issubclass(client_half, FastPathLimits):
            return cls()
        stack, replay = client_half.cannot_stack, client_half.cannot_replay
        return cls(stacks=not stack, replays=not replay, reason="; ".join(r for r in (stack, replay) if r))

    def summary(self) -> str:
        """``stacks, replays`` or what of them holds."""
        return ", ".join(name for name, holds in (("stacks", self.stacks), ("replays", self.replays)) if holds) or "-"


@dataclass(frozen=True)
class Reporting:
    """What only reports, tables and figures read of a method, declared apart from its mathematics: nothing of
    it changes how the method trains, and every field may be left out."""

    label: str | Callable[[Any], str] = ""
    """Its display name in figures and tables, or a function of its params giving one (a variant's name);
    "" = its registered name."""
    label_note: str = ""
    """What the parts of its label mean, where they are the papers' shorthand (a figure prints it under its
    legend)."""
    single_model: bool = False
    """True if every client is evaluated with the one global model (FedAvg), so the run's ``accuracy`` is the
    global model's (the papers' tables read it); False if clients are evaluated with models of their own
    (``global_accuracy``, where the method has a global model besides them, is the global model's)."""
    epochs_by_round: Callable[[Any, int, int], int] | None = None
    """``(params, round, train.local_epochs) -> epochs`` where its client half's local epochs vary from round to
    round (KT-pFL's ramp); None: ``train.local_epochs`` every round. ``reproduce --plan`` costs rounds by it."""
    figures: Callable[[Any, FinishedRun], list[Figure]] | None = None
    """``(params, finished run) -> figures`` it draws of itself (``rayfed plot``), as data; None: none."""


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm: its hyper-parameter dataclass and its two halves."""

    name: str
    params_type: type
    server_half: type[ServerHalf[Any, Any]]
    client_half: type[ClientHalf[Any, Any]]
    summary: str
    keeps_client_state: bool = False
    """True if clients keep state between rounds (stored in the client state store)."""
    reporting: Reporting = Reporting()
    """What reports, tables and figures read of it."""

    @property
    def capabilities(self) -> Capabilities:
        """What the fast path may do with its client half's training (:meth:`Capabilities.of`)."""
        return Capabilities.of(self.client_half)

    def label(self, params: Any) -> str:
        """How figures and tables name this algorithm run with ``params``."""
        label = self.reporting.label
        return (label if isinstance(label, str) else label(params)) or self.name

    def figures(self, params: Any, run: FinishedRun) -> list[Figure]:
        """The figures this method draws of a finished run (:attr:`Reporting.figures`); none by default."""
        return [] if self.reporting.figures is None else self.reporting.figures(params, run)


def _import_algorithms(name: str | None) -> None:
    """Import the module named ``name`` of this package, if there is one, or (``None``) every module."""
    package = importlib.import_module(__package__ or "rayfed.algorithms")
    if name is None:
        for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
            importlib.import_module(f"{package.__name__}.{module.name}")
    elif name.isidentifier() and importlib.util.find_spec(f"{package.__name__}.{name}") is not None:
        importlib.import_module(f"{package.__name__}.{name}")


ALGORITHMS: Registry[Algorithm] = Registry(
    "algorithm", field="algorithm.name", also_named_by=("algorithm.client",), load=_import_algorithms
)


def register_algorithm(
    name: str,
    *,
    params: type,
    server: type[ServerHalf[Any, Any]],
    client: type[ClientHalf[Any, Any]],
    summary: str,
    keeps_client_state: bool = False,
    reporting: Reporting = Reporting(),
) -> Algorithm:
    """Register an algorithm under ``name``; one call at the bottom of its module (in rayfed, or in a module or
    script of your own: :mod:`rayfed.util.plugins` carries it to every process of a run).

    ``params`` is its hyper-parameters' dataclass (``algorithm.params.*``), ``server`` and ``client`` its halves,
    ``summary`` one line for ``rayfed list``; ``keeps_client_state`` says that its clients keep state between
    rounds (``job.state``); ``reporting`` what only reports, tables and figures read of it (:class:`Reporting`: its
    label, ...). What a half declares beside the contract is opt-in, on the half itself
    (:mod:`rayfed.algorithms.declarations`).
    """
    algorithm = Algorithm(name, params, server, client, summary, keeps_client_state, reporting)
    ALGORITHMS.register(name, origin=caller_module())(algorithm)
    return algorithm


@dataclass(frozen=True)
class ResolvedAlgorithm:
    """What an ``AlgorithmConfig`` names, resolved once: both halves, their params, client state.

    The engine, the workers and the server all build their halves from this one object.
    """

    algorithm: Algorithm
    server_params: Any
    client_params: Any
    client_algorithm: Algorithm
    """The algorithm whose client half runs: :attr:`algorithm`, or the one ``algorithm.client`` borrows from."""
    keeps_client_state: bool
    """True if the run's clients keep state between rounds (either half's algorithm keeps it)."""

    @property
    def name(self) -> str:
        return self.algorithm.name

    def local_epochs(self, train: TrainConfig, round_index: int) -> int:
        """The local epochs a client trains in round ``round_index``: ``train.local_epochs``, or the schedule of the
        algorithm whose client half runs (:attr:`Algorithm.epochs_by_round`)."""
        schedule = self.client_algorithm.reporting.epochs_by_round
        return train.local_epochs if schedule is None else schedule(self.client_params, round_index, train.local_epochs)

    @property
    def capabilities(self) -> Capabilities:
        """The fast path's freedom with the run's client half: that of the algorithm whose client half runs."""
        return self.client_algorithm.capabilities

    def validate(self, spec: ProblemSpec) -> None:
        """The server half's check of its params against the problem (before anything is written)."""
        self.algorithm.server_half.validate(self.server_params, spec)

    def held_out(self, spec: ProblemSpec) -> HeldOutRequest | None:
        """The server half's request for held-out data, if it declares one
        (:class:`~rayfed.algorithms.declarations.HeldOutData`)."""
        return held_out_request(self.algorithm.server_half, self.server_params, spec)

    def client_state_bytes(self, spec: ProblemSpec, train: TrainConfig) -> int:
        """Bytes one client keeps between rounds: 0 without client state; else
        :meth:`StateSizes.client_state_bytes` of the algorithm that keeps it (this one, or the one whose
        client half is borrowed, with its params)."""
        if not self.keeps_client_state:
            return 0
        if self.algorithm.keeps_client_state:
            return sizes_of(self.algorithm.server_half).client_state_bytes(self.server_params, spec, train)
        return sizes_of(self.client_algorithm.server_half).client_state_bytes(self.client_params, spec, train)

    @property
    def may_hold_nan(self) -> frozenset[str]:
        """The server state arrays in which NaN is a value (:attr:`StateSizes.may_hold_nan`)."""
        return sizes_of(self.algorithm.server_half).may_hold_nan

    def server_state_bytes(self, spec: ProblemSpec) -> int:
        """Bytes the server half holds (:meth:`StateSizes.server_state_bytes`)."""
        return sizes_of(self.algorithm.server_half).server_state_bytes(self.server_params, spec)

    def make_server(self, spec: ProblemSpec, initial: Mapping[str, np.ndarray]) -> ServerHalf[Any, Any]:
        return self.algorithm.server_half(self.server_params, spec, initial)

    def make_client(self, spec: ProblemSpec) -> ClientHalf[Any, Any]:
        """The run's client half: the algorithm's own, training the phases of the one ``algorithm.client`` borrows
        from (:class:`~rayfed.algorithms.borrowed.BorrowedTraining`) when it borrows."""
        own = self.algorithm.client_half(self.server_params, spec)
        if self.client_algorithm is self.algorithm:
            return own
        lent = self.client_algorithm.client_half(self.client_params, spec)
        return BorrowedTraining(own, lent, (self.client_algorithm.name, self.algorithm.name))
