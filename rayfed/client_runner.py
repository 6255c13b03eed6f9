""":class:`ClientRunner`, the plain class behind a ``ClientWorker`` actor: trains and evaluates batches of clients.

A runner is created once per worker per run. It keeps references to the dataset (read
zero-copy from Ray's object store) and the partition (client index arrays), builds one
model per architecture once, and on each call turns client ids into
:class:`~rayfed.training.ClientJob` objects, runs the algorithm's halves on them and
returns one summed :class:`~rayfed.algorithms.base.Contribution` for the whole batch
(local aggregation) plus a small report per client.

Nothing here imports Ray: tests drive it directly, and the actor is a thin shell.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from rayfed.algorithms import Broadcast, ClientHalf, Contribution, RoundContext, resolve
from rayfed.config import RunConfig
from rayfed.data import ArrayDataset, Partition, normalize_batch
from rayfed.flat import FlatModel
from rayfed.models import build_model
from rayfed.problem import ProblemSpec
from rayfed.seeding import client_seed
from rayfed.state_store import ClientState
from rayfed.training import ClientJob, TrainStats, evaluate_model
from rayfed.vectorized import can_stack, resolve_vectorize, train_stacked

logger = logging.getLogger(__name__)

__all__ = ["ClientReport", "EvalReport", "TrainResult", "ClientRunner", "ClientState", "pick_device"]


@dataclass(frozen=True)
class ClientReport:
    """What the driver learns about one client's local update (a few numbers)."""

    client_id: int
    num_train: int
    train_loss: float
    steps: int
    update_norm: float
    bytes_up: int
    bytes_down: int
    seconds: float
    rejected: str = ""
    """Why the update was left out of the aggregation ("" = accepted)."""


@dataclass(frozen=True)
class EvalReport:
    client_id: int
    num_test: int
    correct: int
    loss_sum: float


@dataclass
class TrainResult:
    contribution: Contribution | None
    reports: list[ClientReport]
    states: dict[int, ClientState] = field(default_factory=dict)


def pick_device(num_gpus: float) -> torch.device:
    """CUDA when the worker was given a (fraction of a) GPU, else CPU."""
    if num_gpus > 0 and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


class ClientRunner:
    """Trains and evaluates batches of virtual clients on one process."""

    def __init__(self, config: RunConfig, spec: ProblemSpec, dataset: ArrayDataset, partition: Partition) -> None:
        torch.set_num_threads(config.engine.torch_threads)
        self.config = config
        self.spec = spec
        self.dataset = dataset
        self.partition = partition
        self.device = pick_device(config.engine.num_gpus_per_worker)
        self.client_half: ClientHalf[object] = resolve(config.algorithm).make_client(spec)
        self._models: dict[str, FlatModel] = {}
        self._label_counts = partition.label_counts
        self._train_label_counts = partition.train_label_counts

    # --- public calls (one per actor method) ---------------------------------------------
    def train(
        self,
        broadcast: Broadcast,
        ctx: RoundContext,
        client_ids: list[int],
        states: dict[int, ClientState] | None = None,
    ) -> TrainResult:
        """Personalise, train and collect the contribution of each client in ``client_ids``.

        Clients of one architecture are trained stacked (:mod:`rayfed.vectorized`) when
        ``engine.vectorize`` allows it, else one after the other.
        """
        states = states or {}
        result = TrainResult(None, [])
        jobs = [self._job(cid, ctx.round, states.get(cid), with_train=True) for cid in client_ids]
        for group in self._stacks(jobs):
            started = time.perf_counter()
            if len(group) == 1:
                job = group[0]
                broadcast.personalise(job)
                start = job.flat.vector.detach().clone()
                # Layers that draw from torch's global generator (dropout) get the client's seed too,
                # so a client trains the same on any worker and in any run.
                torch.manual_seed(job.generator.initial_seed())
                stats = self.client_half.train(job)
                self._finish(result, broadcast, ctx, job, start, stats, time.perf_counter() - started)
                continue
            starts, constants = [], []
            for job in group:
                broadcast.personalise(job)
                starts.append(job.flat.vector.detach().clone())
                constants.append(self.client_half.loss_constants(job))
            trained, stats_list = train_stacked(group, torch.stack(starts), self.client_half, constants)
            seconds = (time.perf_counter() - started) / len(group)
            for job, start, vector, stats in zip(group, starts, trained, stats_list):
                job.flat.load(vector)
                self._finish(result, broadcast, ctx, job, start, stats, seconds)
        return result

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
            if not can_stack(arch_jobs[0].flat, self.client_half):
                out.extend([job] for job in arch_jobs)
                continue
            out.extend(arch_jobs[i : i + engine.stack_size] for i in range(0, len(arch_jobs), engine.stack_size))
        return out

    def _finish(
        self,
        result: TrainResult,
        broadcast: Broadcast,
        ctx: RoundContext,
        job: ClientJob,
        start: torch.Tensor,
        stats: TrainStats,
        seconds: float,
    ) -> None:
        """Collect a trained client: check its update, add its contribution, report it."""
        contribution = broadcast.contribute(job)
        update_norm = float(torch.linalg.vector_norm(job.flat.vector.detach() - start))
        rejected = self._rejection(contribution, update_norm)
        if rejected:
            logger.warning("round %d: update of client %d rejected: %s", ctx.round, job.client_id, rejected)
        else:
            if result.contribution is None:
                result.contribution = contribution
            else:  # in place where the contribution supports it, else a new sum
                result.contribution += contribution
            if job.state is not None:
                result.states[job.client_id] = job.state
        result.reports.append(
            ClientReport(
                client_id=job.client_id,
                num_train=job.num_train,
                train_loss=stats.loss,
                steps=stats.steps,
                update_norm=update_norm,
                bytes_up=contribution.nbytes,
                bytes_down=broadcast.bytes_down(job),
                seconds=seconds,
                rejected=rejected,
            )
        )

    def evaluate(
        self, broadcast: Broadcast, client_ids: list[int], states: dict[int, ClientState] | None = None
    ) -> list[EvalReport]:
        """Accuracy of each client's evaluation model (``broadcast.prepare_eval``) on its own test split."""
        states = states or {}
        reports = []
        for cid in client_ids:
            job = self._job(cid, -1, states.get(cid), with_train=False)
            broadcast.prepare_eval(job)
            result = evaluate_model(job.model, job.x_test, job.y_test)
            reports.append(EvalReport(cid, result.count, result.correct, result.loss_sum))
        return reports

    # --- internals -----------------------------------------------------------------------
    def model_for(self, architecture: str) -> FlatModel:
        """This worker's model of ``architecture``, built on first use (its values are always overwritten)."""
        if architecture not in self._models:
            module = build_model(architecture, self.dataset.input_shape, self.dataset.num_classes).to(self.device)
            self._models[architecture] = FlatModel(module)
        return self._models[architecture]

    def _tensors(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        # uint8 goes to the device and is normalised there: a 4x smaller host-to-GPU copy.
        x = normalize_batch(self.dataset.images[indices], self.dataset.mean, self.dataset.std, device=self.device)
        y = torch.from_numpy(self.dataset.labels[indices])
        return x, y.to(self.device, non_blocking=True)

    def _job(self, cid: int, round_index: int, state: ClientState | None, *, with_train: bool) -> ClientJob:
        architecture = self.spec.architecture_of(cid)
        empty_x = torch.empty((0, *self.dataset.input_shape), device=self.device)
        empty_y = torch.empty((0,), dtype=torch.long, device=self.device)
        x_train, y_train = self._tensors(self.partition.train(cid)) if with_train else (empty_x, empty_y)
        x_test, y_test = (empty_x, empty_y) if with_train else self._tensors(self.partition.test(cid))
        return ClientJob(
            client_id=cid,
            round=round_index,
            flat=self.model_for(architecture),
            architecture=architecture,
            x_train=x_train,
            y_train=y_train,
            x_test=x_test,
            y_test=y_test,
            label_counts=self._label_counts[cid],
            train_label_counts=self._train_label_counts[cid],
            train=self.config.train,
            generator=torch.Generator().manual_seed(client_seed(self.config.seed, round_index, cid)),
            state=state,
        )

    def _rejection(self, contribution: Contribution, update_norm: float) -> str:
        if not math.isfinite(update_norm) or not contribution.is_finite():
            return "non-finite update (NaN or Inf)"
        bound = self.config.engine.max_update_norm
        if bound is not None and update_norm > bound:
            return f"update norm {update_norm:.4g} exceeds engine.max_update_norm={bound:g}"
        return ""
