"""What a half may declare beside the contract, each opt-in: a half subclasses the declaration it needs.

The contract (:class:`~rayfed.algorithms.hooks.ClientHalf`, :class:`~rayfed.algorithms.hooks.ServerHalf`) is what
every method writes. These are not the method's mathematics but facts the engine uses to build models, to
evaluate faster or to carve data out before the run, and most methods have none of them. A client half:

* :class:`SharedBodyEvaluation`: its clients' evaluation models share everything but the output layer, so
  the worker runs the body once over all their test samples (FedAvg's, FedPer's, cwFedAvg's);
* :class:`NormalizedFeatures`: its output layer reads L2-normalised features (FedNH's cosine classifier);
* :class:`EvaluationReadsTrain`: its ``evaluation`` or ``fine_tuning`` reads the client's training split
  (FedBABU fine-tunes on it, IFCA picks its cluster by training loss), so evaluation jobs carry it;
* :class:`FastPathLimits`: its mathematics keeps its clients off part of the fast path (no method in rayfed:
  every one stacks and replays);
* :class:`VaryingWork`: its clients' work changes from round to round (KT-pFL's, FedClassAvg's, FedFomo's,
  APPLE's, FedProto's), so that a system model times each round's own.

A server half:

* :class:`HeldOutData`: data no client may own (FedLAW's proxy set, KT-pFL's public set);
* :class:`AsynchronousAggregation`: it aggregates asynchronously (FedAsync, FedBuff), the one declaration the
  engine reads for it: its schedule's concurrency and buffer, each round's uploads with the server steps they
  arrive at, and the step a round without uploads still takes from the updates kept for it;
* what its state weighs, where it differs from the default: :class:`~rayfed.algorithms.sizing.StateSizes`.

A half that borrows another's phases (``algorithm.client``, :class:`~rayfed.algorithms.borrowed.BorrowedTraining`)
evaluates as its own half declares; its models read normalised features if either half's do. The functions
below answer for any half, borrowed or not; the worker asks them, never the classes.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rayfed.algorithms.borrowed import BorrowedTraining
from rayfed.algorithms.hooks import ClientHalf, RoundContext, Start
from rayfed.train.problem import ProblemSpec

if TYPE_CHECKING:
    from rayfed.data.held_out import HeldOutRequest
    from rayfed.train.job import ClientJob

__all__ = [
    "SharedBody",
    "SharedBodyEvaluation",
    "NormalizedFeatures",
    "EvaluationReadsTrain",
    "FastPathLimits",
    "VaryingWork",
    "HeldOutData",
    "AsynchronousAggregation",
    "shared_body",
    "normalizes_features",
    "evaluation_reads_train",
    "held_out_request",
    "varies_work",
    "work_start",
]


@dataclass(frozen=True)
class SharedBody:
    """Evaluation models that differ at most in the output layer: ``state`` outside it, and each client's
    output layer ``weight`` (C, K, h) and ``bias`` (C, K), or None when every client uses ``state`` whole."""

    state: np.ndarray
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None


class SharedBodyEvaluation(abc.ABC):
    """A client half whose clients' evaluation models may share everything but the output layer."""

    @abc.abstractmethod
    def shared_body(self, message: Any, jobs: Sequence[ClientJob]) -> SharedBody | None:
        """The evaluation models of ``jobs`` (one architecture) as one body and their output layers, or None
        when they do not share one this round (each client is then evaluated with a forward of its own)."""


class NormalizedFeatures:
    """A client half whose output layer reads L2-normalised features: the worker builds its models so
    (:func:`rayfed.models.layers.normalize_inputs_of`)."""


class EvaluationReadsTrain:
    """A client half whose ``evaluation`` or ``fine_tuning`` reads the client's training split: evaluation jobs
    carry it (without this declaration they carry the test split alone)."""


class FastPathLimits:
    """A client half whose clients cannot train as one stack, or whose steps cannot be replayed from CUDA graphs,
    because its mathematics forbids it; each says why ("" = it can). The loop trains every method's phases both
    ways, so a method declares this only for what its phases cannot express (``rayfed list METHOD`` shows it, a run
    logs it once, and ``rayfed check`` reports it)."""

    cannot_stack: ClassVar[str] = ""
    """Why its clients cannot train as one stack ("" = they can)."""
    cannot_replay: ClassVar[str] = ""
    """Why its steps cannot be replayed from CUDA graphs ("" = they can)."""


class VaryingWork:
    """A client half whose clients' work changes from round to round: the steps of its phases (KT-pFL's distillation
    from the second round and its ramp of local epochs, FedClassAvg's warm-up in a client's first round) or the
    bytes of its download (FedFomo's, APPLE's and KT-pFL's, whose first message carries no other client's model, and
    FedProto's, which carries no prototype). A system model then finds each round's work from that round's message
    and each sampled client's state, building their starts and phases without training them
    (:mod:`rayfed.scheduling.workload`); the work of a half that does not declare this is found once, from the first
    round."""

    def work_start(self, message: Any, job: ClientJob) -> Start:
        """The start a round's work is found from: the client's own (``start``), or a cheaper one of the same
        phases and download where the start computes what neither reads (FedFomo's weighing of the models)."""
        assert isinstance(self, ClientHalf)
        return self.start(message, job)


class HeldOutData(abc.ABC):
    """A server half that needs data no client may own."""

    @classmethod
    @abc.abstractmethod
    def held_out(cls, params: Any, spec: ProblemSpec) -> HeldOutRequest:
        """The server data no client may own (FedLAW's proxy set, KT-pFL's public set), carved out of the pool
        before the partition (:mod:`rayfed.data.held_out`) and handed to both halves as ``spec.held_out``."""


class AsynchronousAggregation(abc.ABC):
    """A server half that aggregates asynchronously in virtual time (FedAsync, FedBuff; docs/system.md): the engine
    runs it one round per server step of a schedule its params shape (:meth:`schedule`), and hands it each round's
    uploads with the server step each one arrives at (:meth:`aggregate_arriving`, in place of ``aggregate``). An
    update kept for a later step still makes it when that round has no acceptable upload: the server then asks
    :meth:`step_without_uploads` where it would otherwise keep the state. This is the one thing that makes a method
    asynchronous: the engine reads it, never the params' type."""

    @classmethod
    @abc.abstractmethod
    def schedule(cls, params: Any) -> tuple[int, int]:
        """(C, K): the clients training at once and the updates each server step applies."""

    @abc.abstractmethod
    def aggregate_arriving(
        self, ctx: RoundContext, contribution: Any, arrives_at: np.ndarray | None
    ) -> dict[str, float]:
        """Aggregate the uploads of the clients launched from version ``ctx.round``; ``arrives_at`` (int64, one per
        sampled client, as ``ctx.sampled``) the version each one's update arrives to make, None without a schedule
        (a round driven by hand: every update makes the next version). Returns metrics."""

    @abc.abstractmethod
    def step_without_uploads(self, ctx: RoundContext) -> dict[str, float]:
        """Fold into the state what was kept for round ``ctx.round``; returns metrics."""


def _evaluated(client: ClientHalf[Any, Any]) -> ClientHalf[Any, Any]:
    """The half whose evaluation runs: a borrowing half's own."""
    return client.own if isinstance(client, BorrowedTraining) else client


def shared_body(client: ClientHalf[Any, Any], message: Any, jobs: Sequence[ClientJob]) -> SharedBody | None:
    """``client``'s shared body for ``jobs``, if it declares one (:class:`SharedBodyEvaluation`)."""
    evaluated = _evaluated(client)
    return evaluated.shared_body(message, jobs) if isinstance(evaluated, SharedBodyEvaluation) else None


def normalizes_features(client: ClientHalf[Any, Any]) -> bool:
    """Whether ``client``'s models read normalised features (:class:`NormalizedFeatures`): a borrowing half's
    do if either its own or the lent phases' half declares it (the lent phases may train a cosine classifier)."""
    halves = (client.own, client.training) if isinstance(client, BorrowedTraining) else (client,)
    return any(isinstance(half, NormalizedFeatures) for half in halves)


def evaluation_reads_train(client: ClientHalf[Any, Any]) -> bool:
    """Whether ``client``'s evaluation jobs carry the training split (:class:`EvaluationReadsTrain`)."""
    return isinstance(_evaluated(client), EvaluationReadsTrain)


def varies_work(client: ClientHalf[Any, Any]) -> bool:
    """Whether ``client``'s work changes from round to round (:class:`VaryingWork`): a borrowing half's does if its
    own half's start and download do or the lent half's phases do."""
    halves = (client.own, client.training) if isinstance(client, BorrowedTraining) else (client,)
    return any(isinstance(half, VaryingWork) for half in halves)


def work_start(client: ClientHalf[Any, Any], message: Any, job: ClientJob) -> Start:
    """The start ``client``'s round's work is found from (:meth:`VaryingWork.work_start`; else its start)."""
    starting = client.own if isinstance(client, BorrowedTraining) else client
    return starting.work_start(message, job) if isinstance(starting, VaryingWork) else client.start(message, job)


def held_out_request(server_half: type, params: Any, spec: ProblemSpec) -> HeldOutRequest | None:
    """The held-out data ``server_half`` declares it needs (:class:`HeldOutData`), or None."""
    return server_half.held_out(params, spec) if issubclass(server_half, HeldOutData) else None
