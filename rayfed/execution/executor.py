"""How the driver reaches the server and the workers: in-process or on Ray.

The round loop (:mod:`rayfed.engine`) is written once against :class:`Executor`.
:class:`LocalExecutor` runs the plain :class:`~rayfed.execution.server.Server` and one
:class:`~rayfed.execution.client_runner.ClientRunner` in this process (for debugging and fast tests);
:class:`rayfed.actors.RayExecutor` runs them as Ray actors. Both return the same
values for the same batches of clients, the batches (:func:`num_calls`,
:func:`make_chunks`) do not depend on the number of workers, and the server adds the batches' sums along one
tree over them (:mod:`rayfed.execution.summation`), so a run gives the same numbers on either, with any number of
workers.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfed.config import RunConfig
from rayfed.data import ArrayDataset, ClientPartition
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.devices import check_local_gpu
from rayfed.execution.reports import ClientReport, EvalReport
from rayfed.execution.round_facts import RoundFacts
from rayfed.execution.server import Server
from rayfed.train.job import ClientState
from rayfed.train.problem import ProblemSpec

__all__ = ["no_progress", "Executor", "LocalExecutor", "Chunk", "RoundCalls", "num_calls", "make_chunks", "states_of"]

Chunk = list[int]

MIN_CALLS = 8
"""Calls a round is split into at least when ``engine.clients_per_call=0`` (fewer only with fewer clients)."""
MAX_CLIENTS_PER_CALL = 64
"""Most clients in one call when ``engine.clients_per_call=0``: large rounds get more calls, for large clusters."""


def num_calls(num_clients: int, clients_per_call: int) -> int:
    """How many worker calls ``num_clients`` clients are split into: never a function of the workers.

    Each training call returns the sum of its clients' contributions, so the split fixes
    the order of the float additions, and with it the run's numbers: with the split
    depending only on the clients and ``engine.clients_per_call``, the local backend and
    Ray with any number of workers give the same numbers. ``clients_per_call=0`` makes at
    least :data:`MIN_CALLS` calls (a balanced load for up to 8 workers, and what a failed
    call re-runs stays small) of at most :data:`MAX_CLIENTS_PER_CALL` clients.

    >>> num_calls(100, 0), num_calls(1000, 0), num_calls(100, 30)
    (8, 16, 4)
    """
    if clients_per_call:
        return -(-num_clients // clients_per_call)
    return max(MIN_CALLS, -(-num_clients // MAX_CLIENTS_PER_CALL))


def make_chunks(client_ids: Sequence[int] | np.ndarray, sizes: np.ndarray, num_chunks: int) -> list[Chunk]:
    """Split ``client_ids`` into at most ``num_chunks`` batches of balanced total size.

    Greedy longest-processing-time assignment on the clients' training sizes; each batch
    is sorted and batches are ordered by their first id, so the split (and hence the
    order in which partial sums are merged) is deterministic.
    """
    ids = np.asarray(client_ids, dtype=np.int64)
    num_chunks = max(1, min(num_chunks, len(ids)))
    if num_chunks == 1:
        return [ids.tolist()]
    order = ids[np.argsort(-sizes[ids], kind="stable")]
    loads = np.zeros(num_chunks)
    bins: list[list[int]] = [[] for _ in range(num_chunks)]
    for cid in order.tolist():
        target = int(np.argmin(loads))
        bins[target].append(cid)
        loads[target] += max(1, int(sizes[cid]))
    chunks = [sorted(b) for b in bins if b]
    return sorted(chunks, key=lambda c: c[0])


def states_of(states: Mapping[int, ClientState], chunk: Chunk) -> dict[int, ClientState]:
    """The states of the chunk's clients that have one (what a worker call carries)."""
    return {cid: states[cid] for cid in chunk if cid in states}


@dataclass(frozen=True)
class RoundCalls:
    """One round's worker calls, as the round loop hands them to an executor to train or evaluate: the server's
    message (or a handle on it), the round's facts, the clients split into calls, and the states of those that keep
    one."""

    message: Any
    facts: RoundFacts
    chunks: list[Chunk]
    states: Mapping[int, ClientState]

    def arguments(self, index: int, facts: Any = None) -> tuple[Any, Any, Chunk, dict[int, ClientState]]:
        """What worker call ``index`` receives: the message, the round's facts (or ``facts``, a handle on them, as
        Ray's object store holds them once for every call), its clients and their states."""
        chunk = self.chunks[index]
        return self.message, self.facts if facts is None else facts, chunk, states_of(self.states, chunk)


def no_progress() -> None:
    """The default ``on_chunk_done``: report nothing."""


class Executor(abc.ABC):
    """The driver's handle on the server and the workers for one run."""

    dataset: ArrayDataset
    """The run's dataset as the executor holds it: on Ray the object store's copy, read without a copy, so that
    the driver keeps no private one beside it."""

    @abc.abstractmethod
    def broadcast(self) -> Any:
        """A handle on the server's current broadcast (an object, or a Ray ObjectRef)."""

    def message(self, broadcast: Any) -> Any:
        """The server's message behind ``broadcast`` (:meth:`broadcast`'s handle), on this process: what the driver
        reads of it (a system model's round of a method whose work changes by round)."""
        return broadcast

    @abc.abstractmethod
    def train(
        self, calls: RoundCalls, on_chunk_done: Callable[[], object] = no_progress
    ) -> tuple[list[Any], list[ClientReport], dict[int, ClientState]]:
        """Train every call's clients; returns contribution handles (call order), reports and new client states.
        ``on_chunk_done`` is called as each call finishes (the round's progress bar)."""

    @abc.abstractmethod
    def aggregate(self, ctx: RoundFacts, contributions: list[Any]) -> dict[str, float]: ...

    @abc.abstractmethod
    def evaluate(self, calls: RoundCalls, on_chunk_done: Callable[[], object] = no_progress) -> list[EvalReport]:
        """Evaluate every call's clients on the message of round ``calls.facts.round`` (their reports, call
        order)."""

    @abc.abstractmethod
    def server_state(self) -> dict[str, np.ndarray]: ...

    @abc.abstractmethod
    def load_server_state(self, state: Mapping[str, np.ndarray]) -> None: ...

    def close(self) -> None:
        """Release workers and the server."""


class LocalExecutor(Executor):
    """Everything in this process: one worker, the server, no Ray."""

    def __init__(
        self,
        config: RunConfig,
        spec: ProblemSpec,
        dataset: ArrayDataset,
        partition: ClientPartition,
        initial: Mapping[str, np.ndarray],
    ) -> None:
        check_local_gpu(config.engine)
        self.dataset = dataset
        self.server = Server(config, spec, initial)
        self.runner = ClientRunner(config, spec, dataset, partition)

    def broadcast(self) -> Any:
        return self.server.broadcast()

    def train(
        self, calls: RoundCalls, on_chunk_done: Callable[[], object] = no_progress
    ) -> tuple[list[Any], list[ClientReport], dict[int, ClientState]]:
        contributions, reports, new_states = [], [], {}
        for index in range(len(calls.chunks)):
            result = self.runner.train(*calls.arguments(index))
            contributions.append(result.contribution)
            reports.extend(result.reports)
            new_states.update(result.states)
            on_chunk_done()
        return contributions, reports, new_states

    def aggregate(self, ctx: RoundFacts, contributions: list[Any]) -> dict[str, float]:
        return self.server.aggregate(ctx, *contributions)

    def evaluate(self, calls: RoundCalls, on_chunk_done: Callable[[], object] = no_progress) -> list[EvalReport]:
        reports = []
        for index in range(len(calls.chunks)):
            reports.extend(self.runner.evaluate(*calls.arguments(index)))
            on_chunk_done()
        return reports

    def server_state(self) -> dict[str, np.ndarray]:
        return self.server.state_dict()

    def load_server_state(self, state: Mapping[str, np.ndarray]) -> None:
        self.server.load_state_dict(state)
