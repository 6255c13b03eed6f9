""":class:`ClientRunner`, the plain class behind a ``ClientWorker`` actor: trains and evaluates batches of clients.

A runner is created once per worker per run. It keeps the dataset (read zero-copy from Ray's
object store, on a GPU copied to it once) and the partition (client index arrays), builds one
model per architecture once, and on each call turns client ids into
:class:`~rayfed.train.job.ClientJob` objects: their client half personalises them, the one loop
(:class:`~rayfed.train.loop.LocalLoop`) trains the phases the client half declares, one client at a
time or a stack of clients at once, and the client half makes their uploads, which a
:class:`~rayfed.execution.settlement.Settlement` checks, sums (local aggregation) and reads back once.

Nothing here imports Ray: tests drive it directly, and the actor is a thin shell.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch

from rayfed.algorithms import Broadcast, ClientHalf, Contribution, RoundContext, resolve
from rayfed.config import RunConfig
from rayfed.data import ArrayDataset, ClientPartition
from rayfed.execution.client_data import ClientData
from rayfed.execution.evaluation import evaluate_clients
from rayfed.execution.reports import EvalReport, TrainResult
from rayfed.execution.settlement import Measures, Settlement, Uploads
from rayfed.models.layers import normalize_inputs_of
from rayfed.train.evaluate import correct_predictions, mean_cross_entropy
from rayfed.train.flat import FlatModel
from rayfed.train.graphs import StepGraphs
from rayfed.train.job import ClientJob, ClientState, seed_global_generators
from rayfed.train.loop import LocalLoop
from rayfed.train.phase import Phase
from rayfed.train.problem import ProblemSpec
from rayfed.train.stacked_layers import model_unstackable

__all__ = ["ClientRunner", "resolve_vectorize"]


def resolve_vectorize(setting: str, device: torch.device) -> bool:
    """``engine.vectorize``: ``on``/``off``, or ``auto`` = stack on CUDA, sequential on CPU.

    On a GPU one client's step is latency-bound (a few kernels on a small batch), so a step of C
    clients costs little more than one; on a CPU the arithmetic is the bound and stacking gains
    nothing (benchmarks/README.md, "Stacked against sequential training").
    """
    if setting == "auto":
        return device.type == "cuda"
    return setting == "on"


class ClientRunner(ClientData):
    """Trains and evaluates batches of virtual clients on one process."""

    def __init__(self, config: RunConfig, spec: ProblemSpec, dataset: ArrayDataset, partition: ClientPartition) -> None:
        super().__init__(config, spec, dataset, partition)
        algorithm = resolve(config.algorithm)
        self.client_half: ClientHalf[object] = algorithm.make_client(self.spec)
        self.capabilities = algorithm.capabilities
        self.graphs = StepGraphs(self.device, enabled=config.engine.cuda_graphs and self.capabilities.replays)
        self.loop = LocalLoop(self.graphs, dataset.mean, dataset.std)

    def model_for(self, architecture: str) -> FlatModel:
        """This worker's model of ``architecture``; its output layer reads normalised features where the client
        half asks for it (:attr:`ClientHalf.normalized_features`)."""
        flat = super().model_for(architecture)
        if self.client_half.normalized_features:
            normalize_inputs_of(flat.module, self.spec.output_layer[architecture])
        return flat

    # --- public calls (one per actor method) ---------------------------------------------
    def train(
        self,
        broadcast: Broadcast,
        ctx: RoundContext,
        client_ids: list[int],
        states: dict[int, ClientState] | None = None,
    ) -> TrainResult:
        """Personalise, train and collect the contribution of each client in ``client_ids``: clients of one
        architecture as stacks when ``engine.vectorize`` allows it, else one after the other."""
        states = states or {}
        samples = self.train_samples(client_ids)
        jobs = [self.job(cid, ctx, states.get(cid), train=data) for cid, data in zip(client_ids, samples)]
        settlement = Settlement(ctx, self.config.engine.max_update_norm)
        for group in self._stacks(jobs):
            if len(group) == 1:
                self._train_one(broadcast, group[0], settlement)
            else:
                self._train_stack(broadcast, group, settlement)
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
        return evaluate_clients(self, broadcast, ctx, client_ids, states, self.prepare_eval)

    def prepare_eval(self, broadcast: Broadcast, job: ClientJob) -> None:
        """Load the client's evaluation model, and train the phases its client half asks for first."""
        phases = self.client_half.prepare_eval(broadcast, job)
        if phases:
            self.loop.train_one(job, phases, replays=self.capabilities.replays)

    # --- training ---------------------------------------------------------------------------
    def _train_one(self, broadcast: Broadcast, job: ClientJob, settlement: Settlement) -> None:
        started = time.perf_counter()
        self.client_half.personalise(broadcast, job)
        start = job.flat.vector.detach().clone()
        start_loss = self._start_loss(job)
        # Layers without client masks that draw from torch's global generator get the client's seed too.
        seed_global_generators(job.generator.initial_seed(), job.device)
        loss, steps = self.loop.train_one(job, self.client_half.phases(job), replays=self.capabilities.replays)
        measures = self._measures(job, start_loss)
        norm = torch.linalg.vector_norm(job.flat.vector.detach() - start)
        contribution = self.client_half.contribute(broadcast, job)
        settlement.add(
            Uploads.of_one(
                job, contribution, loss, norm, steps, broadcast.bytes_down(job), time.perf_counter() - started, measures
            )
        )

    def _train_stack(self, broadcast: Broadcast, group: list[ClientJob], settlement: Settlement) -> None:
        started = time.perf_counter()
        starts = None if self.config.engine.eval_train_loss else self.client_half.personalise_stacked(broadcast, group)
        start_losses: list[Any] = [math.nan] * len(group)
        if starts is None:  # one by one: each client's starting loss reads its personalised model
            rows, start_losses = [], []
            for job in group:
                self.client_half.personalise(broadcast, job)
                rows.append(job.flat.state())
                start_losses.append(self._start_loss(job))
            starts = torch.stack(rows)
        phases = [self.client_half.phases(job) for job in group]
        seconds = (time.perf_counter() - started) / len(group)
        for members in _same_phases(phases):
            jobs = [group[i] for i in members]
            own = starts if len(members) == len(group) else torch.stack([starts[i] for i in members])
            self._stack(
                broadcast,
                jobs,
                own,
                [phases[i] for i in members],
                [start_losses[i] for i in members],
                seconds,
                settlement,
            )

    def _stack(
        self,
        broadcast: Broadcast,
        jobs: list[ClientJob],
        starts: torch.Tensor,
        phases: list[list[Phase]],
        start_losses: list[Any],
        seconds: float,
        settlement: Settlement,
    ) -> None:
        """Train one stack and hand its clients' uploads to ``settlement``: one summed contribution where the client
        side makes one at once (``ClientHalf.contribute_stacked``), else each client's."""
        started = time.perf_counter()
        trained = self.loop.train_stack(jobs, starts, phases, replays=self.capabilities.replays)
        flat = jobs[0].flat
        norms = torch.linalg.vector_norm(trained.states[:, : flat.size] - starts[:, : flat.size], dim=1)
        measures = [Measures(loss) for loss in start_losses]
        if self.config.engine.eval_local:
            measures = []
            for job, row, start_loss in zip(jobs, trained.states, start_losses):
                flat.load_state(row)
                measures.append(self._measures(job, start_loss))
        seconds += (time.perf_counter() - started) / len(jobs)
        summed = self.client_half.contribute_stacked(broadcast, jobs, trained.states)

        def parts() -> list[Contribution]:
            made = []
            for job, row in zip(jobs, trained.states):
                flat.load_state(row)
                made.append(self.client_half.contribute(broadcast, job))
            return made

        if summed is None:
            for i, (job, contribution) in enumerate(zip(jobs, parts())):
                settlement.add(
                    Uploads.of_one(
                        job,
                        contribution,
                        trained.losses[i],
                        norms[i],
                        trained.steps[i],
                        broadcast.bytes_down(job),
                        seconds,
                        measures[i],
                    )
                )
            return
        settlement.add(
            Uploads(
                [job.client_id for job in jobs],
                [job.num_train for job in jobs],
                trained.steps,
                summed,
                parts,
                [job.state for job in jobs],
                [broadcast.bytes_down(job) for job in jobs],
                seconds,
                trained.losses,
                norms,
                measures,
            )
        )

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
        """Groups of jobs trained together: runs of one architecture when stacking is on and the algorithm and the
        model allow it (``Capabilities.stacks``, :func:`~rayfed.train.stacked_layers.stack_blocker`), else
        singletons."""
        engine = self.config.engine
        if not resolve_vectorize(engine.vectorize, self.device) or not self.capabilities.stacks:
            return [[job] for job in jobs]
        groups: dict[str, list[ClientJob]] = {}
        for job in jobs:
            groups.setdefault(job.architecture, []).append(job)
        out: list[list[ClientJob]] = []
        for arch, arch_jobs in groups.items():
            if model_unstackable(arch, arch_jobs[0].flat.module, self.config.train.drop_last):
                out.extend([job] for job in arch_jobs)
                continue
            out.extend(arch_jobs[i : i + engine.stack_size] for i in range(0, len(arch_jobs), engine.stack_size))
        return out


def _same_phases(phases: Sequence[Sequence[Phase]]) -> list[list[int]]:
    """The positions of clients whose phases have equal signatures (those train in one stack), in order."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, own in enumerate(phases):
        groups.setdefault(tuple(p.signature() for p in own), []).append(i)
    return list(groups.values())
