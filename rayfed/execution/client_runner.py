""":class:`ClientRunner`, the plain class behind a ``ClientWorker`` actor: trains and evaluates batches of clients.

A runner is created once per worker per run. It keeps the dataset (read zero-copy from Ray's
object store, on a GPU copied to it once) and the partition (client index arrays), builds one
model per architecture once, and on each call turns client ids into
:class:`~rayfed.train.job.ClientJob` objects, runs the algorithm's halves on them and returns
one summed :class:`~rayfed.algorithms.hooks.Contribution` for the whole batch (local
aggregation) plus a small report per client (:mod:`rayfed.execution.settlement`).

Nothing here imports Ray: tests drive it directly, and the actor is a thin shell.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from rayfed.algorithms import Broadcast, ClientHalf, RoundContext, resolve
from rayfed.config import RunConfig
from rayfed.data import ArrayDataset, ClientPartition
from rayfed.execution.client_data import ClientData
from rayfed.execution.evaluation import evaluate_clients
from rayfed.execution.reports import EvalReport, TrainResult
from rayfed.execution.settlement import Measures, Settlement
from rayfed.train.evaluate import correct_predictions, mean_cross_entropy
from rayfed.train.graphs import StepGraphs
from rayfed.train.job import ClientJob, ClientState, seed_global_generators
from rayfed.train.problem import ProblemSpec
from rayfed.train.replayed import ReplayedSGD
from rayfed.train.stacked import StackedTraining, can_stack, resolve_vectorize
from rayfed.train.stacked_layers import has_dropout

__all__ = ["ClientRunner"]


class ClientRunner(ClientData):
    """Trains and evaluates batches of virtual clients on one process."""

    def __init__(self, config: RunConfig, spec: ProblemSpec, dataset: ArrayDataset, partition: ClientPartition) -> None:
        super().__init__(config, spec, dataset, partition)
        self.client_half: ClientHalf[object] = resolve(config.algorithm).make_client(self.spec)
        self.graphs = StepGraphs(self.device, enabled=config.engine.cuda_graphs)
        self._stacked: dict[str, StackedTraining] = {}
        self._replayed = ReplayedSGD(self.graphs)

    # --- public calls (one per actor method) ---------------------------------------------
    def train(
        self,
        broadcast: Broadcast,
        ctx: RoundContext,
        client_ids: list[int],
        states: dict[int, ClientState] | None = None,
    ) -> TrainResult:
        """Personalise, train and collect the contribution of each client in ``client_ids``.

        Clients of one architecture are trained stacked (:mod:`rayfed.train.stacked`) when
        ``engine.vectorize`` allows it, else one after the other.
        """
        states = states or {}
        samples = self.train_samples(client_ids)
        jobs = [self.job(cid, ctx, states.get(cid), train=data) for cid, data in zip(client_ids, samples)]
        settlement = Settlement(ctx, self.config.engine.max_update_norm)
        for group in self._stacks(jobs):
            if len(group) == 1:
                self._train_one(broadcast, group[0], settlement)
            else:
                self._train_stacked(broadcast, group, settlement)
        return settlement.result()

    def evaluate(
        self,
        broadcast: Broadcast,
        ctx: RoundContext,
        client_ids: list[int],
        states: dict[int, ClientState] | None = None,
    ) -> list[EvalReport]:
        """Accuracy of each client's evaluation model on its own test split, and of the global model, if the
        algorithm has one, on the same split (:func:`rayfed.execution.evaluation.evaluate_clients`)."""
        return evaluate_clients(self, broadcast, ctx, client_ids, states)

    # --- training ---------------------------------------------------------------------------
    def _train_one(self, broadcast: Broadcast, job: ClientJob, settlement: Settlement) -> None:
        started = time.perf_counter()
        broadcast.personalise(job)
        start = job.flat.vector.detach().clone()
        start_loss = self._start_loss(job)
        # Layers that draw from torch's global generator (dropout) get the client's seed too,
        # so a client trains the same on any worker and in any run.
        seed_global_generators(job.generator.initial_seed(), job.device)
        stats = self._replayed.train(job) if self._replays(job) else self.client_half.train(job)
        measures = self._measures(job, start_loss)
        settlement.add(broadcast, job, start, stats, time.perf_counter() - started, measures)

    def _replays(self, job: ClientJob) -> bool:
        """Whether the client's steps are replayed from CUDA graphs (:mod:`rayfed.train.replayed`): on a GPU
        that captures, for a client half that trains with the default loop and adds no loss term, on a
        model without dropout (a replayed step would not draw the client's own masks)."""
        half = self.client_half
        return (self.graphs.enabled and half.supports_stacking() and not half.has_extra_loss()
                and not has_dropout(job.flat.module))

    def _train_stacked(self, broadcast: Broadcast, group: list[ClientJob], settlement: Settlement) -> None:
        started = time.perf_counter()
        starts = self._stacked_starts(broadcast, group)
        if starts is None:  # one by one: each client's constants and starting loss read its personalised model
            rows, constants, start_losses = [], [], []
            for job in group:
                broadcast.personalise(job)
                rows.append(job.flat.state())
                start_losses.append(self._start_loss(job))
                constants.append(self.client_half.loss_constants(job))
            starts = torch.stack(rows)
        else:
            constants, start_losses = [{}] * len(group), [math.nan] * len(group)
        stacked = self._stacked.setdefault(group[0].architecture, StackedTraining(group[0].flat, self.graphs))
        trained, losses, steps = stacked.train(group, starts, self.client_half, constants)
        if self.config.engine.eval_local:
            measures = []
            for job, row, start_loss in zip(group, trained, start_losses):
                job.flat.load_state(row)
                measures.append(self._measures(job, start_loss))
        else:
            measures = [Measures(start_loss) for start_loss in start_losses]
        seconds = (time.perf_counter() - started) / len(group)
        settlement.add_stack(broadcast, group, starts, trained, losses, steps, seconds, measures)

    def _stacked_starts(self, broadcast: Broadcast, group: list[ClientJob]) -> Any:
        """The stack's starting states formed at once (``Broadcast.personalise_stacked``), where nothing needs a
        client's personalised model (no loss constants, no starting loss); else None."""
        if self.config.engine.eval_train_loss or type(self.client_half).loss_constants is not ClientHalf.loss_constants:
            return None
        return broadcast.personalise_stacked(group)

    def _start_loss(self, job: ClientJob) -> Any:
        """``train_loss_eval`` of a personalised job: the mean cross-entropy of the model it starts the round
        from over its own train split, in eval mode and without any regulariser (what the papers' logs call
        the train loss), on the device; NaN unless ``engine.eval_train_loss`` asks for it, or without data."""
        if not self.config.engine.eval_train_loss or job.num_train == 0:
            return math.nan
        return mean_cross_entropy(job.model, job.x_train, job.y_train)

    def _measures(self, job: ClientJob, start_loss: Any) -> Measures:
        """What is measured of a trained client besides its training: ``start_loss`` and, with
        ``engine.eval_local``, its trained model's correct predictions on its own test split, on the device."""
        if not self.config.engine.eval_local:
            return Measures(start_loss)
        x_test, y_test = self.gather(self.partition.test(job.client_id))
        return Measures(start_loss, len(y_test), correct_predictions(job.model, x_test, y_test))

    def _stacks(self, jobs: list[ClientJob]) -> list[list[ClientJob]]:
        """Groups of jobs trained together: runs of one architecture when stacking is on, else singletons."""
        engine = self.config.engine
        if not resolve_vectorize(engine.vectorize, self.device):
            return [[job] for job in jobs]
        groups: dict[str, list[ClientJob]] = {}
        for job in jobs:
            groups.setdefault(job.architecture, []).append(job)
        out: list[list[ClientJob]] = []
        for arch_jobs in groups.values():
            if not can_stack(arch_jobs[0].flat, self.client_half, self.config.train):
                out.extend([job] for job in arch_jobs)
                continue
            out.extend(arch_jobs[i : i + engine.stack_size] for i in range(0, len(arch_jobs), engine.stack_size))
        return out
