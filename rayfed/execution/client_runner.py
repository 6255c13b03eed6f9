""":class:`ClientRunner`, the plain class behind a ``ClientWorker`` actor: trains and evaluates batches of clients.

A runner is created once per worker per run. It keeps the dataset (read zero-copy from Ray's
object store, on a GPU copied to it once) and the partition (client index arrays), builds one
model per architecture once, and on each call turns client ids into
:class:`~rayfed.train.job.ClientJob` objects. For each, the client half gives its start, its phases
(checked before anything trains, :mod:`rayfed.train.phase_checks`) and, once the one loop
(:class:`~rayfed.train.loop.LocalLoop`) has trained them, one client at a time or a stack of clients at
once, its upload; a :class:`~rayfed.execution.settlement.Settlement` checks the uploads, sums them (local
aggregation) and reads everything the call made back once. The client half writes nothing for stacks: the
runner forms them (clients of one architecture whose phases stack, :mod:`rayfed.train.stacking`).

Nothing here imports Ray: tests drive it directly, and the actor is a thin shell.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import numpy as np
import torch

from rayfed.algorithms import ClientHalf, Contribution, RoundContext, resolve
from rayfed.algorithms.contributions import WeightedState
from rayfed.algorithms.declarations import normalizes_features, work_start
from rayfed.algorithms.private_uploads import ModelRowsUpload, declared_parts
from rayfed.config import RunConfig
from rayfed.data import ArrayDataset, ClientPartition
from rayfed.execution.client_data import ClientData
from rayfed.execution.devices import stacks_on
from rayfed.execution.evaluation import evaluate_clients
from rayfed.execution.privacy import ClientPrivacy
from rayfed.execution.reports import EvalReport, TrainResult
from rayfed.execution.round_facts import RoundFacts
from rayfed.execution.settlement import Measures, Settlement, Uploads, sum_in_order
from rayfed.execution.stack_merger import current_merger
from rayfed.models.layers import normalize_inputs_of
from rayfed.train.evaluate import correct_predictions, mean_cross_entropy
from rayfed.train.flat import FlatModel
from rayfed.train.graphs import StepGraphs
from rayfed.train.host import to_device
from rayfed.train.job import ClientJob, ClientState, seed_global_generators
from rayfed.train.loop import LocalLoop
from rayfed.train.phase import Phase, with_budget_cover
from rayfed.train.phase_checks import PhaseContext, check_phases
from rayfed.train.problem import ProblemSpec
from rayfed.train.stacked_layers import model_unstackable
from rayfed.train.stacking import stack_groups
from rayfed.train.step import phase_steps

__all__ = ["ClientRunner"]


class ClientRunner(ClientData):
    """Trains and evaluates batches of virtual clients on one process."""

    def __init__(self, config: RunConfig, spec: ProblemSpec, dataset: ArrayDataset, partition: ClientPartition) -> None:
        super().__init__(config, spec, dataset, partition)
        algorithm = resolve(config.algorithm)
        self.method = algorithm.client_algorithm.name
        self.keeps_state = algorithm.keeps_client_state
        self.client_half: ClientHalf[Any, Any] = algorithm.make_client(self.spec)
        self.capabilities = algorithm.capabilities
        self.graphs = StepGraphs(self.device, enabled=config.engine.cuda_graphs and self.capabilities.replays)
        self.loop = LocalLoop(self.graphs, dataset.mean, dataset.std, self.spec.output_layer, self.method)
        parts = declared_parts(algorithm.algorithm.server_half)
        rows = issubclass(algorithm.algorithm.server_half, ModelRowsUpload)
        private = config.privacy.enabled
        self.privacy = ClientPrivacy(config, self.method, self.client_half, parts, rows) if private else None
        """Clips (and with local DP noises) the clients' uploads (:mod:`rayfed.execution.privacy`); None: off."""
        self.merger = current_merger()
        """Where the stacks go when runs share them (:func:`rayfed.run_many`); None: this run's own."""

    def model_for(self, architecture: str) -> FlatModel:
        """This worker's model of ``architecture``; its output layer reads normalised features where the client
        half declares it (:class:`~rayfed.algorithms.declarations.NormalizedFeatures`)."""
        flat = super().model_for(architecture)
        if normalizes_features(self.client_half):
            normalize_inputs_of(flat.module, self.spec.output_layer[architecture])
        return flat

    # --- public calls (one per actor method) ---------------------------------------------
    def train(
        self,
        message: Any,
        ctx: RoundContext,
        client_ids: list[int],
        states: dict[int, ClientState] | None = None,
    ) -> TrainResult:
        """Start, train and collect the upload of each client in ``client_ids``: clients of one architecture as
        stacks when ``engine.vectorize`` allows it, else one after the other. ``ctx`` is the engine's
        :class:`RoundFacts` (a bare ``RoundContext``: a round without step budgets or a clip norm of its own)."""
        ctx, states = RoundFacts.of(ctx), states or {}
        samples = self.train_samples(client_ids)
        jobs = [self.job(cid, ctx, states.get(cid), train=data) for cid, data in zip(client_ids, samples)]
        settlement = Settlement(ctx, self.config.engine.max_update_norm)
        for group in self._stacks(jobs):
            if len(group) == 1:
                self._train_one(message, group[0], settlement)
            else:
                self._train_stack(message, group, settlement)
        return settlement.result()

    def evaluate(
        self,
        message: Any,
        ctx: RoundContext,
        client_ids: list[int],
        states: dict[int, ClientState] | None = None,
    ) -> list[EvalReport]:
        """Accuracy of each client's evaluation model on its own test split, and of the global model, if the
        algorithm has one, on the same split (:func:`rayfed.execution.evaluation.evaluate_clients`)."""
        return evaluate_clients(self, self.client_half, message, ctx, client_ids, states, self.evaluation_model)

    def evaluation_model(self, message: Any, job: ClientJob) -> None:
        """Load the client's evaluation model, and train the phases its client half fine-tunes it with first."""
        job.flat.load_state(_state_on(self.client_half.evaluation(message, job), job.device))
        phases = self._checked(self.client_half.fine_tuning(message, job), job, "fine_tuning", may_be_empty=True)
        if phases:
            self.loop.train_one(job, phases, replays=self.capabilities.replays)

    # --- training ---------------------------------------------------------------------------
    def _start(self, message: Any, job: ClientJob) -> Any:
        """The client's start (``job.start``) and the state it starts from."""
        job.start = self.client_half.start(message, job)
        return job.start.model

    def _phases(self, message: Any, job: ClientJob) -> list[Phase]:
        """The client's phases, checked, each saying whether a deadline's step budget covers it."""
        return with_budget_cover(self._checked(self.client_half.phases(message, job), job, "phases"))

    def work_steps(
        self, message: Any, ctx: RoundContext, client_id: int, num_train: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The steps that client ``client_id``'s phases of round ``ctx`` draw, found without training them, for a
        client of its architecture with each of ``num_train`` training samples: over all its phases, and over
        those a deadline's step budget covers (a system model's workload, :mod:`rayfed.scheduling.workload`)."""
        _, phases = self._untrained(message, ctx, client_id, None)
        return _phases_steps(phases, num_train, self.config)

    def round_work(
        self, message: Any, ctx: RoundContext, states: dict[int, ClientState]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each client of round ``ctx`` (``ctx.sampled``), started from its state in ``states`` and its phases built
        without training them: its steps over all its phases and over those a step budget covers, and the bytes it
        downloads (the round's workload of a method whose work changes by round, :mod:`rayfed.scheduling.workload`)."""
        work = np.zeros((3, len(ctx.sampled)), dtype=np.int64)
        for row, cid in enumerate(ctx.sampled.tolist()):
            job, phases = self._untrained(message, ctx, cid, states.get(cid))
            every, budgeted = _phases_steps(phases, np.array([job.num_train]), self.config)
            work[:, row] = every[0], budgeted[0], self.client_half.bytes_down(message, job)
        return work[0], work[1], work[2]

    def _untrained(
        self, message: Any, ctx: RoundContext, client_id: int, state: ClientState | None
    ) -> tuple[ClientJob, list[Phase]]:
        """Client ``client_id``'s job in round ``ctx``, started from ``state`` (:func:`work_start`) and its phases
        built, nothing trained."""
        (data,) = self.train_samples([client_id])
        job = self.job(client_id, ctx, state, train=data)
        job.start = work_start(self.client_half, message, job)
        job.flat.load_state(_state_on(job.start.model, job.device))
        return job, self._phases(message, job)

    def _checked(self, phases: Any, job: ClientJob, hook: str, *, may_be_empty: bool = False) -> list[Phase]:
        where = PhaseContext(self.method, hook, job.client_id, job.flat, self.keeps_state, may_be_empty)
        return check_phases(phases, where)

    def _train_one(self, message: Any, job: ClientJob, settlement: Settlement) -> None:
        started = time.perf_counter()
        start = _state_on(self._start(message, job), job.device)
        job.flat.load_state(start)
        start_loss = self._start_loss(job)
        # Layers without client masks that draw from torch's global generator get the client's seed too.
        seed_global_generators(job.generator.initial_seed(), job.device)
        loss, steps = self.loop.train_one(job, self._phases(message, job), replays=self.capabilities.replays)
        measures = self._measures(job, start_loss)
        norm = torch.linalg.vector_norm(job.flat.vector.detach() - start[: job.flat.size])  # the start, as a stack's
        made = self.client_half.upload(message, job)
        private = self.privacy
        upload = _made(made, job) if private is None else private.one([made], job, start, settlement.ctx, message)
        down = self.client_half.bytes_down(message, job)
        settlement.add(Uploads.of_one(job, upload, loss, norm, steps, down, time.perf_counter() - started, measures))

    def _train_stack(self, message: Any, group: list[ClientJob], settlement: Settlement) -> None:
        started = time.perf_counter()
        starts = _stacked_states([self._start(message, job) for job in group], group[0].device)
        start_losses: list[Any] = [math.nan] * len(group)
        if self.config.engine.eval_train_loss:  # each client's starting loss reads its starting model
            start_losses = []
            for job, row in zip(group, starts):
                job.flat.load_state(row)
                start_losses.append(self._start_loss(job))
        phases = [self._phases(message, job) for job in group]
        seconds = (time.perf_counter() - started) / len(group)
        for members in stack_groups(self.method, phases):
            own = starts if len(members) == len(group) else starts[members]
            jobs = [group[i] for i in members]
            self._stack(
                message,
                jobs,
                own,
                [phases[i] for i in members],
                [start_losses[i] for i in members],
                seconds,
                settlement,
            )

    def _stack(
        self,
        message: Any,
        jobs: list[ClientJob],
        starts: torch.Tensor,
        phases: list[list[Phase]],
        start_losses: list[Any],
        seconds: float,
        settlement: Settlement,
    ) -> None:
        """Train one stack and hand its clients' uploads to ``settlement`` as one entry. Each client's model is read
        from the stack when its client half asks for it (``job.trained``, ``job.model``); uploads declared as a
        weighted state (FedAvg's) are made for the whole stack in one product."""
        started = time.perf_counter()
        pack = self.config.engine.pack_lanes
        train = self.loop.train_stack if self.merger is None else functools.partial(self.merger.train_stack, self.loop)
        trained = train(jobs, starts, phases, replays=self.capabilities.replays, pack=pack)
        flat = jobs[0].worker_model
        norms = torch.linalg.vector_norm(trained.states[:, : flat.size] - starts[:, : flat.size], dim=1)
        for row, job in enumerate(jobs):
            job.pending = (trained.states, row)
        measures = [self._measures(job, loss) for job, loss in zip(jobs, start_losses)]
        made = [self.client_half.upload(message, job) for job in jobs]
        sizes = [job.num_train for job in jobs]
        declared = made[0] if all(isinstance(m, WeightedState) and m == made[0] for m in made) else None

        contribution: Contribution
        if self.privacy is not None:
            contribution, parts = self.privacy.stack(made, jobs, trained.states, starts, settlement.ctx, message)
            rows = not contribution.sum_is_one_part  # a row each (asynchronous aggregation): a client's share
            bytes_up = [contribution.nbytes // len(jobs) if rows else contribution.nbytes] * len(jobs)
        elif isinstance(declared, WeightedState):
            contribution = declared.of_stack(trained.states, sizes)
            bytes_up = [contribution.nbytes] * len(jobs)  # each client's upload is as large as their sum

            def parts() -> list[Contribution]:
                return [_made(m, job) for m, job in zip(made, jobs)]
        else:
            each = [_made(m, job) for m, job in zip(made, jobs)]
            total = sum_in_order(each)
            assert total is not None  # a stack has clients
            contribution, bytes_up = total, [part.nbytes for part in each]

            def parts() -> list[Contribution]:
                return each

        settlement.add(
            Uploads(
                [job.client_id for job in jobs],
                sizes,
                trained.steps,
                contribution,
                parts,
                [job.state for job in jobs],
                bytes_up,
                [self.client_half.bytes_down(message, job) for job in jobs],
                seconds + (time.perf_counter() - started) / len(jobs),
                trained.losses,
                norms,
                measures,
                [job.trained_steps for job in jobs],
            )
        )

    def _start_loss(self, job: ClientJob) -> Any:
        """``train_loss_eval`` of a started job: the mean cross-entropy of the model it starts the round from
        over its own train split, in eval mode and without any regulariser (what the papers' logs call the train
        loss), on the device; NaN unless ``engine.eval_train_loss`` asks for it, or without data."""
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
        singletons. A call's clients are fixed by the round's chunks, never by the pool, so which clients share
        a stack never depends on the number of workers."""
        engine = self.config.engine
        if not stacks_on(engine.vectorize, self.device.type) or not self.capabilities.stacks:
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


def _phases_steps(phases: list[Phase], num_train: np.ndarray, config: RunConfig) -> tuple[np.ndarray, np.ndarray]:
    """The steps ``phases`` draw for clients with ``num_train`` training samples: over all of them, and over those a
    step budget covers."""
    none = np.zeros(len(num_train), np.int64)
    every = sum((phase_steps(p, num_train, config.train) for p in phases), none)
    return every, sum((phase_steps(p, num_train, config.train) for p in phases if p.budgeted), none)


def _made(upload: Contribution | WeightedState, job: ClientJob) -> Contribution:
    """A client's upload as a contribution: a declared weighted state made from its trained model."""
    return upload.of_one(job.trained, job.num_train) if isinstance(upload, WeightedState) else upload


def _state_on(state: Any, device: torch.device) -> torch.Tensor:
    """A client half's state (a numpy array or a tensor) as a float32 tensor on ``device``."""
    if isinstance(state, torch.Tensor):
        return state
    return to_device([np.asarray(state, dtype=np.float32)], device)[0]


def _stacked_states(states: list[Any], device: torch.device) -> torch.Tensor:
    """The clients' starting states as one (C, S) tensor on ``device``: the one state they all start from, moved
    once and seen C times (a global model), else every host state moved in one transfer."""
    if all(state is states[0] for state in states):
        return _state_on(states[0], device).expand(len(states), -1)
    host = [i for i, state in enumerate(states) if not isinstance(state, torch.Tensor)]
    moved = iter(to_device([np.asarray(states[i], dtype=np.float32) for i in host], device))
    return torch.stack([next(moved) if i in host else state for i, state in enumerate(states)])
