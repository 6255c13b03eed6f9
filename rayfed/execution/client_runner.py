""":class:`ClientRunner`, the plain class behind a ``ClientWorker`` actor: trains and evaluates batches of clients.

A runner is created once per worker per run. It keeps references to the dataset (read
zero-copy from Ray's object store) and the partition (client index arrays), builds one
model per architecture once, and on each call turns client ids into
:class:`~rayfed.train.job.ClientJob` objects, runs the algorithm's halves on them and
returns one summed :class:`~rayfed.algorithms.hooks.Contribution` for the whole batch
(local aggregation) plus a small report per client.

Nothing here imports Ray: tests drive it directly, and the actor is a thin shell.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F

from rayfed.algorithms import Broadcast, ClientHalf, Contribution, RoundContext, SharedBody, resolve
from rayfed.config import RunConfig
from rayfed.data import ArrayDataset, ClientPartition, model_inputs
from rayfed.execution.devices import pick_device
from rayfed.models import build_model
from rayfed.train.evaluate import EvalStats, eval_batch_size, evaluate_model, features_before_output
from rayfed.train.flat import FlatModel
from rayfed.train.job import EVALUATION_ROUND, ClientJob, ClientState, TrainStats, seed_global_generators
from rayfed.train.problem import ProblemSpec
from rayfed.train.stacked import can_stack, resolve_vectorize, train_stacked
from rayfed.util.seeding import client_seed

logger = logging.getLogger(__name__)

__all__ = ["ClientReport", "EvalReport", "TrainResult", "ClientRunner"]


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
    train_loss_eval: float = math.nan
    """Mean cross-entropy of the client's starting model over its train split (``engine.eval_train_loss``), else NaN."""
    local_num_test: int = 0
    """Test samples the trained model was evaluated on (``engine.eval_local``); 0 when it was not."""
    local_correct: int = 0
    """Correct predictions of the client's model right after its local training on its own test split."""


@dataclass(frozen=True)
class EvalReport:
    """One client's test results: its own evaluation model's, and the global model's if the algorithm has one."""

    client_id: int
    num_test: int
    correct: int
    loss_sum: float
    global_correct: int | None = None
    """Correct predictions of the global model (``Broadcast.prepare_global_eval``); None without one."""
    global_loss_sum: float | None = None


class _Tally:
    """Correct predictions and summed cross-entropy per client, added batch by batch on the device."""

    def __init__(self, num_clients: int, device: torch.device) -> None:
        self.correct = torch.zeros(num_clients, device=device)
        self.loss_sum = torch.zeros(num_clients, device=device)

    def add(self, logits: torch.Tensor, target: torch.Tensor, rows: torch.Tensor) -> None:
        self.correct.index_add_(0, rows, (logits.argmax(dim=1) == target).float())
        self.loss_sum.index_add_(0, rows, F.cross_entropy(logits, target, reduction="none"))

    def results(self, sizes: torch.Tensor) -> list[tuple[int, int, float]]:
        """(test samples, correct, summed loss) per client."""
        return [(int(n), int(c), float(loss))
                for n, c, loss in zip(sizes.tolist(), self.correct.tolist(), self.loss_sum.tolist())]


@dataclass
class TrainResult:
    contribution: Contribution | None
    reports: list[ClientReport]
    states: dict[int, ClientState] = field(default_factory=dict)


class _ClientData:
    """A worker's view of the clients: their data (read zero-copy) and one model per architecture."""

    def __init__(self, config: RunConfig, spec: ProblemSpec, dataset: ArrayDataset, partition: ClientPartition) -> None:
        torch.set_num_threads(config.engine.torch_threads)
        self.config = config
        self.spec = spec.for_clients()  # held-out server data reaches the workers only when shared
        self.dataset = dataset
        self.partition = partition
        self.device = pick_device(config.engine.num_gpus_per_worker)
        self._models: dict[str, FlatModel] = {}
        self._label_counts = partition.label_counts
        self._train_label_counts = partition.train_label_counts
        self._no_samples = self._tensors(np.zeros(0, dtype=np.int64))
        """The (inputs, labels) of a job without data of a split: no samples, the inputs' dtype and shape."""

    def model_for(self, architecture: str) -> FlatModel:
        """This worker's model of ``architecture``, built on first use (its values are always overwritten)."""
        if architecture not in self._models:
            module = build_model(architecture, self.dataset.input_shape, self.dataset.num_classes).to(self.device)
            self._models[architecture] = FlatModel(module)
        return self._models[architecture]

    def _tensors(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        # uint8 images (int32 token ids) go to the device and become model inputs there: a 4x (2x) smaller copy.
        x = model_inputs(self.dataset.inputs[indices], self.dataset.mean, self.dataset.std, device=self.device)
        y = torch.from_numpy(self.dataset.labels[indices])
        return x, y.to(self.device, non_blocking=True)

    def _job(
        self, cid: int, ctx: RoundContext, state: ClientState | None, *, split: str | None, evaluation: bool = False
    ) -> ClientJob:
        """Client ``cid``'s job in the round ``ctx`` with the tensors of its ``split`` ("train", "test" or None:
        no data); an ``evaluation`` job draws from :data:`EVALUATION_ROUND`."""
        round_index = EVALUATION_ROUND if evaluation else ctx.round
        architecture = self.spec.architecture_of(cid)
        x_train, y_train = self._tensors(self.partition.train(cid)) if split == "train" else self._no_samples
        x_test, y_test = self._tensors(self.partition.test(cid)) if split == "test" else self._no_samples
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
            lr=ctx.lr,
            generator=torch.Generator().manual_seed(client_seed(ctx.seed, round_index, cid)),
            state=state,
        )

    def _pooled_test(self, client_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(test sizes, images, labels, owner index) of the clients' test splits, concatenated."""
        splits = [self.partition.test(cid) for cid in client_ids]
        sizes = torch.tensor([len(split) for split in splits], device=self.device)
        x, y = self._tensors(np.concatenate(splits))
        owner = torch.repeat_interleave(torch.arange(len(client_ids), device=self.device), sizes)
        return sizes, x, y, owner


class ClientRunner(_ClientData):
    """Trains and evaluates batches of virtual clients on one process."""

    def __init__(self, config: RunConfig, spec: ProblemSpec, dataset: ArrayDataset, partition: ClientPartition) -> None:
        super().__init__(config, spec, dataset, partition)
        self.client_half: ClientHalf[object] = resolve(config.algorithm).make_client(self.spec)

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
        result = TrainResult(None, [])
        jobs = [self._job(cid, ctx, states.get(cid), split="train") for cid in client_ids]
        for group in self._stacks(jobs):
            started = time.perf_counter()
            if len(group) == 1:
                job = group[0]
                broadcast.personalise(job)
                start = job.flat.vector.detach().clone()
                start_loss = train_loss_at_start(job, self.config.engine.eval_train_loss)
                # Layers that draw from torch's global generator (dropout) get the client's seed too,
                # so a client trains the same on any worker and in any run.
                seed_global_generators(job.generator.initial_seed(), job.device)
                stats = self.client_half.train(job)
                self._finish(result, broadcast, ctx, job, start, stats, time.perf_counter() - started, start_loss)
                continue
            starts, constants, start_losses = [], [], []
            for job in group:
                broadcast.personalise(job)
                starts.append(job.flat.vector.detach().clone())
                start_losses.append(train_loss_at_start(job, self.config.engine.eval_train_loss))
                constants.append(self.client_half.loss_constants(job))
            trained, stats_list = train_stacked(group, torch.stack(starts), self.client_half, constants)
            seconds = (time.perf_counter() - started) / len(group)
            for job, start, vector, stats, start_loss in zip(group, starts, trained, stats_list, start_losses):
                job.flat.load(vector)
                self._finish(result, broadcast, ctx, job, start, stats, seconds, start_loss)
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
        start_loss: float = math.nan,
    ) -> None:
        """Collect a trained client: check its update, add its contribution, report it."""
        local = self._evaluate_trained(job)
        contribution = broadcast.contribute(job)
        update_norm = float(torch.linalg.vector_norm(job.flat.vector.detach() - start))
        rejected = rejection(contribution, update_norm, self.config.engine.max_update_norm)
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
                train_loss_eval=start_loss,
                local_num_test=local.count,
                local_correct=local.correct,
            )
        )

    def _evaluate_trained(self, job: ClientJob) -> EvalStats:
        """``engine.eval_local``: the trained model of ``job`` on the client's own test split (none: 0 samples)."""
        if not self.config.engine.eval_local:
            return EvalStats(correct=0, loss_sum=0.0, count=0)
        x_test, y_test = self._tensors(self.partition.test(job.client_id))
        return evaluate_model(job.model, x_test, y_test)

    def evaluate(
        self,
        broadcast: Broadcast,
        ctx: RoundContext,
        client_ids: list[int],
        states: dict[int, ClientState] | None = None,
    ) -> list[EvalReport]:
        """Accuracy of each client's evaluation model (``broadcast.prepare_eval``) on its own test split,
        and of the global model (``broadcast.prepare_global_eval``), if the algorithm has one, on the same split.

        Clients whose evaluation models share everything but the output layer
        (``broadcast.shared_body``) are evaluated together: one forward of the shared body over all
        their test samples, then each client's output layer as a batched matrix product. A global
        model with that same body costs one more matrix product; any other global model one forward
        over all their test samples.
        """
        states = states or {}
        by_architecture: dict[str, list[int]] = {}
        for cid in client_ids:
            by_architecture.setdefault(self.spec.architecture_of(cid), []).append(cid)
        reports: dict[int, EvalReport] = {}
        for ids in by_architecture.values():
            population = replace(
                self._job(ids[0], ctx, None, split=None, evaluation=True),
                client_id=-1, label_counts=self._label_counts.sum(axis=0),
                train_label_counts=self._train_label_counts.sum(axis=0),
            )
            global_state = population.flat.state_numpy() if broadcast.prepare_global_eval(population) else None
            plan = broadcast.shared_body(
                [self._job(cid, ctx, states.get(cid), split=None, evaluation=True) for cid in ids]
            )
            if plan is not None and plan.weight is None:  # one model for every client: one pooled forward
                own = self._evaluate_pooled(ids, plan.state)
                on_global = own if global_state is not None and np.array_equal(global_state, plan.state) else None
            elif plan is not None:
                own, on_global = self._evaluate_shared(ids, plan, global_state)
            else:
                own = []
                for cid in ids:
                    job = self._job(cid, ctx, states.get(cid), split="test", evaluation=True)
                    if broadcast.eval_needs_train:  # prepare_eval reads the train split (FedBABU, IFCA)
                        job.x_train, job.y_train = self._tensors(self.partition.train(cid))
                    broadcast.prepare_eval(job)
                    result = evaluate_model(job.model, job.x_test, job.y_test)
                    own.append((result.count, result.correct, result.loss_sum))
                on_global = None
            if global_state is not None and on_global is None:
                on_global = self._evaluate_pooled(ids, global_state)
            for i, (cid, (count, correct, loss_sum)) in enumerate(zip(ids, own)):
                g_correct, g_loss = (None, None) if on_global is None else on_global[i][1:]
                reports[cid] = EvalReport(cid, count, correct, loss_sum, g_correct, g_loss)
        return [reports[cid] for cid in client_ids]

    def _evaluate_shared(
        self, client_ids: list[int], plan: SharedBody, global_state: np.ndarray | None
    ) -> tuple[list[tuple[int, int, float]], list[tuple[int, int, float]] | None]:
        """Evaluate clients that share the body of ``plan``: features once, heads batched. The global
        model rides along when its body is the plan's: (count, correct, loss) per client, on their own
        models and on the global model (None when it needs a forward of its own)."""
        architecture = self.spec.architecture_of(client_ids[0])
        flat = self.model_for(architecture)
        output = self.spec.output_layer[architecture]
        global_head = _global_head(flat, output, plan, global_state)
        flat.load_state(plan.state)
        sizes, x, y, owner = self._pooled_test(client_ids)
        weight = torch.as_tensor(plan.weight, device=self.device)
        bias = torch.as_tensor(plan.bias, device=self.device)
        own, on_global = _Tally(len(client_ids), self.device), _Tally(len(client_ids), self.device)
        for start, features in features_before_output(flat.module, output, x):
            rows, target = owner[start : start + len(features)], y[start : start + len(features)]
            own.add(torch.bmm(weight[rows], features.unsqueeze(2)).squeeze(2) + bias[rows], target, rows)
            if global_head is not None:
                on_global.add(F.linear(features, *global_head), target, rows)
        return own.results(sizes), on_global.results(sizes) if global_head is not None else None

    @torch.no_grad()
    def _evaluate_pooled(self, client_ids: list[int], state: np.ndarray) -> list[tuple[int, int, float]]:
        """(count, correct, loss) per client of one model (``state``) over all their test samples, in one forward."""
        flat = self.model_for(self.spec.architecture_of(client_ids[0]))
        flat.load_state(state)
        flat.module.eval()
        sizes, x, y, owner = self._pooled_test(client_ids)
        tally = _Tally(len(client_ids), self.device)
        batch = eval_batch_size(self.device)
        for start in range(0, len(y), batch):
            stop = start + batch
            tally.add(flat.module(x[start:stop]), y[start:stop], owner[start:stop])
        return tally.results(sizes)

def train_loss_at_start(job: ClientJob, enabled: bool) -> float:
    """``train_loss_eval`` of a personalised job: the mean cross-entropy of the model it starts the round
    from over its own train split, in eval mode and without any regulariser (what the papers' logs call
    the train loss); NaN unless ``engine.eval_train_loss`` asks for it (``enabled``), or without train data."""
    if not enabled or job.num_train == 0:
        return math.nan
    return evaluate_model(job.model, job.x_train, job.y_train).mean_loss


def rejection(contribution: Contribution, update_norm: float, bound: float | None) -> str:
    """Why an update is rejected (non-finite, or its norm above ``engine.max_update_norm``); "" if accepted."""
    if not math.isfinite(update_norm) or not contribution.is_finite():
        return "non-finite update (NaN or Inf)"
    if bound is not None and update_norm > bound:
        return f"update norm {update_norm:.4g} exceeds engine.max_update_norm={bound:g}"
    return ""


def _global_head(
    flat: FlatModel, output: str, plan: SharedBody, global_state: np.ndarray | None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The global model's output layer (weight, bias), if its body is exactly ``plan``'s body."""
    if global_state is None:
        return None
    head = flat.slice_of(output)
    body = np.ones(len(global_state), dtype=bool)
    body[head] = False
    if not np.array_equal(global_state[body], plan.state[body]):
        return None
    flat.load_state(global_state)
    weight, bias = (flat.module.get_parameter(f"{output}.{name}") for name in ("weight", "bias"))
    return weight.detach().clone(), bias.detach().clone()
