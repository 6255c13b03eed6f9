"""The round loop, written once: sample, train on workers, aggregate, evaluate, log, checkpoint.

>>> from rayfed import RunConfig, run
>>> result = run(RunConfig().override({"train.rounds": 2, "engine.backend": "local"}))  # doctest: +SKIP
>>> result.best_accuracy  # doctest: +SKIP

A run directory holds::

    rayfed-run.json          the run marker, sealed with the checkpoint key: the run's identity, its config, rayfed's
                             version, its plugin files' digests, train.rounds as set and changed
    rayfed.lock              while the run runs: its owner (host, pid, start time)
    config.json              the RunConfig, as given
    partition.parquet        the exact client data sets (rows of client_id, split, index; or slice parameters)
    label_counts.parquet     each client's class counts (whole partition, train split)
    vocabulary.txt           token datasets only: the token of every id, one per line
    held_out.parquet         indices of the server's held-out samples, if the algorithm asks for any
    rounds.parquet           one row per round (accuracy, losses, timings, bytes); with engine.eval_initial
                             first a row round=-1: the initial model, before any training
    clients/round_*.parquet  one row per client per round (clients/initial.parquet: the initial model); an
                             asynchronous client that arrived twice in one step has a row per arrival
    checkpoints/round_*.npz  server state, client states and the round (no pickle)
    summary.json             best and final accuracy, rounds run, rounds without a finite training loss
    tracking.json            with engine.loggers: each tracker's logged run and last step (rayfed.tracking),
                             beside tensorboard/, mlflow.db, mlartifacts/, wandb/ and figures/
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from rayfed.config import RunConfig
from rayfed.engine.callbacks import Callback, Checkpointer, MetricsWriter, ProgressBar, RunView
from rayfed.engine.checkpoint import Checkpoint, checkpoint_round, checkpoints_of, newest_checkpoint
from rayfed.engine.interrupts import RunInterrupted, interrupts_deferred, terminate_as_interrupt, was_terminated
from rayfed.engine.metrics import RoundRecord, client_table, summarise_round
from rayfed.engine.plan import plan_run
from rayfed.engine.privacy_records import PrivacyLedger
from rayfed.engine.result import RunResult
from rayfed.engine.state_store import ClientStateStore
from rayfed.execution.executor import Executor, LocalExecutor, RoundCalls, make_chunks, num_calls
from rayfed.execution.reports import ClientReport
from rayfed.execution.round_facts import RoundFacts
from rayfed.execution.settlement import NON_FINITE
from rayfed.execution.stack_merger import training_backend
from rayfed.provenance.resume_point import drop_client_tables_from, previous_checkpoint_fix
from rayfed.provenance.run_dir import open_run_dir, resume_command
from rayfed.train.job import ClientState
from rayfed.util import plugins
from rayfed.util.allocator import FreedMemory
from rayfed.util.errors import CheckpointError, DiskFullError, ServerError, WorkerError
from rayfed.util.plugin_sources import refuse_run_while_importing
from rayfed.util.progress import progress_bar, progress_shown

logger = logging.getLogger(__name__)

__all__ = ["Simulation", "RunResult", "run", "untrained_cause"]


class Simulation:
    """One run: its directory, data, executor and round loop."""

    def __init__(
        self, config: RunConfig | Mapping[str, Any], *, callbacks: Sequence[Callback] = (), resume: bool = False
    ) -> None:
        config = RunConfig.of(config)
        plan = plan_run(config, resume=resume)  # every check, before anything is written
        config = plan.config  # as it records itself: with the modules that registered its plugins
        self.config, self.algorithm, self.run_dir = config, plan.algorithm, plan.run_dir
        self.run_name = self.run_dir.name
        self.continues = plan.continues
        """Whether the run directory holds this run already (resumed, or started again: no round saved)."""
        self._checkpoint = plan.resume.checkpoint
        self.history: list[dict[str, Any]] = list(plan.resume.history)
        self.start_round = plan.resume.next_round
        inputs = plan.inputs
        self.dataset, self.spec, self.initial, self.partition = (
            inputs.dataset,
            inputs.spec,
            inputs.initial,
            inputs.partition,
        )
        self.num_train = self.partition.num_train()
        self.rounds = plan.rounds
        self.privacy = PrivacyLedger(config, self.history, self.algorithm)
        """The run's accountant and adaptive clip norm (:mod:`rayfed.engine.privacy_records`)."""
        """Whom each round trains, and what the system model records of it (:mod:`rayfed.scheduling.sync_rounds`)."""
        builtin: list[Callback] = [MetricsWriter(), Checkpointer()]
        if config.engine.progress:
            builtin.append(ProgressBar())
        self.callbacks = [*builtin, *callbacks]
        self._opening = (inputs, plan.resume.marker)
        """What :meth:`run` records in the run directory once it holds its lock."""
        self.states = ClientStateStore(self.run_dir / "client_state", int(config.engine.client_state_memory_mb * 2**20))
        self.executor: Executor | None = None
        self._warned_untrained = False
        self.view = RunView(
            self.run_dir,
            config,
            self.spec,
            plan.identity,
            self.start_round,
            lambda: tuple(self.history),
            self._state,
            self.rounds.state,
            self.rounds.devices(),
        )
        """What the callbacks see of this run."""
        for callback in self.callbacks:  # each may refuse the run while nothing is written yet
            callback.before_run(self.view, self.continues)

    def _state(self) -> tuple[dict[str, np.ndarray], Iterator[tuple[int, ClientState]]]:
        """The server state and the client states, as a checkpoint saves them."""
        assert self.executor is not None
        clients = ((cid, self.states.get(cid) or {}) for cid in self.states.ids())
        return self.executor.server_state(), clients

    def _restore(self) -> None:
        """Load the checkpoint read (and checked) by the plan, if its server state has the shapes this run's
        server keeps; drop the per-client tables of rounds to run again."""
        assert self.executor is not None
        if self._checkpoint is None:
            drop_client_tables_from(self.run_dir, self.start_round)
            if self.continues:
                logger.info("%s holds no completed round; starting it again from round 0", self.run_dir)
            return
        self._check_shapes(self._checkpoint, self.executor.server_state())
        drop_client_tables_from(self.run_dir, self.start_round)
        self.executor.load_server_state(self._checkpoint.server)
        if self._checkpoint.system:
            self.rounds.restore(self._checkpoint.system)
        self.states.clear()
        for cid, state in self._checkpoint.clients.items():
            self.states.put(cid, state)
        self._checkpoint = None  # its arrays now live in the executor and the store
        logger.info("resumed %s after round %d", self.run_dir, self.start_round - 1)

    def _check_shapes(self, checkpoint: Checkpoint, expected: Mapping[str, np.ndarray]) -> None:
        """Refuse a checkpoint whose server state is not the state this run's server keeps, offering the previous
        checkpoint where it is sound and fits."""
        problem = _shape_problem(checkpoint, expected)
        if problem is None:
            return
        fix = previous_checkpoint_fix(
            checkpoints_of(self.run_dir),
            self.view.identity,
            self.algorithm.may_hold_nan,
            lambda previous: _shape_problem(previous, expected) is None,
        ) or (
            f"resume it with the rayfed version that wrote it, or start the run again from round 0 by deleting "
            f"{str(checkpoint.path.parent)!r}"
        )
        raise CheckpointError(
            f"checkpoint {str(checkpoint.path)!r} {problem} (algorithm.name={self.config.algorithm.name!r}); {fix}"
        )

    # --- the loop ----------------------------------------------------------------------------
    def _make_executor(self) -> Executor:
        args = (self.config, self.spec, self.dataset, self.partition, self.initial)
        if training_backend(self.config.engine) == "local":
            return LocalExecutor(*args)
        from rayfed.actors import RayExecutor

        return RayExecutor(*args)

    def _hold_executors_dataset(self) -> None:
        """Keep the executor's dataset (on Ray, the object store's) in place of the one loaded, which is then
        freed: the driver holds no second copy of the data through the run."""
        assert self.executor is not None
        inputs, marker = self._opening
        self.dataset = self.executor.dataset
        self._opening = (replace(inputs, dataset=self.dataset), marker)

    def _calls(self, broadcast: Any, ctx: RoundFacts, client_ids: np.ndarray) -> RoundCalls:
        """The worker calls of ``client_ids`` in round ``ctx``: their batches, one per call, the same on every
        backend and number of workers (none for no client: a round of a system model in which no client's work
        counts), with the states of those that keep one."""
        chunks: list[list[int]] = []
        if len(client_ids):
            calls = num_calls(len(client_ids), self.config.engine.clients_per_call)
            chunks = make_chunks(client_ids, self.num_train, calls)
        states = self.states.get_many(client_ids) if self.algorithm.keeps_client_state else {}
        return RoundCalls(broadcast, ctx, chunks, states)

    def _context(self, round_index: int, broadcast: Any) -> RoundFacts:
        """The round's facts, decided once (:meth:`rayfed.scheduling.sync_rounds.Rounds.context`), from its
        ``broadcast``."""
        executor = self.executor
        assert executor is not None

        def message() -> Any:  # fetched only where the rounds read it
            return executor.message(broadcast)

        return self.privacy.context(self.rounds.context(round_index, message, self.states.get_many))

    def run(self) -> RunResult:
        """Take the run directory's lock, record the run there (:func:`~rayfed.provenance.run_dir.open_run_dir`) and
        run the remaining rounds; the executor and the lock are released however the loop ends. SIGTERM stops
        it as Ctrl-C does (:mod:`rayfed.engine.interrupts`)."""
        with terminate_as_interrupt():
            lock = open_run_dir(self.run_dir, self.config, *self._opening)
            try:
                return self._run()
            finally:
                lock.release()

    def _continuation(self) -> str:
        """How the stopped run goes on, from what its directory holds: its newest checkpoint, or none yet."""
        newest, command = newest_checkpoint(self.run_dir), resume_command(self.run_dir)
        if newest is not None:
            return f"continue from its checkpoint of round {checkpoint_round(newest)} with: {command}"
        every = self.config.engine.checkpoint_every
        return f"start it again from round 0 (no checkpoint was saved: engine.checkpoint_every={every}) with: {command}"

    def _run(self) -> RunResult:
        config = self.config
        result: RunResult | None = None
        try:
            self.executor = self._make_executor()
            self._hold_executors_dataset()
            self._restore()
            for callback in self.callbacks:
                callback.on_run_start(self.view)
            broadcast = self.executor.broadcast()
            all_clients = np.arange(config.data.num_clients, dtype=np.int64)
            if config.engine.eval_initial and self.start_round == 0 and not any(r["round"] < 0 for r in self.history):
                self._evaluate_initial(broadcast, all_clients)
            stopped_early, heap = False, FreedMemory()
            for t in range(self.start_round, config.train.rounds):
                heap.give_back()  # the pages the set-up or the last rounds freed go back before this round
                broadcast, stopped_early = self._round(t, broadcast, all_clients)
                if stopped_early:
                    break
            result = RunResult(self.run_dir, config, self.history, stopped_early)
            return result
        except KeyboardInterrupt as stop:
            for callback in self.callbacks:
                callback.on_interrupt(self.view)
            done = next((r["round"] for r in reversed(self.history) if r["round"] >= 0), None)
            raise RunInterrupted(
                self.run_dir, done, config.train.rounds, resume_command(self.run_dir), terminated=was_terminated(stop)
            ) from None
        except DiskFullError as full:
            raise DiskFullError(f"{full}; free some space, then {self._continuation()}") from full
        except (WorkerError, ServerError) as failed:
            raise type(failed)(f"{failed} The run stopped; after fixing the cause, {self._continuation()}") from failed
        finally:
            if self.executor is not None:
                for callback in self.callbacks:
                    callback.on_run_end(self.view, result)
                self.executor.close()

    def _round_progress(self, batches: int, desc: str) -> Any:
        """A bar over the round's client batches; it appears only in rounds long enough to need one."""
        with progress_shown(self.config.engine.progress):
            return progress_bar(batches, desc, "batch")

    def _evaluate_initial(self, broadcast: Any, all_clients: np.ndarray) -> None:
        """``engine.eval_initial``: evaluate the initial model as the papers' code does before its first
        round, recorded as round -1 (rounds.parquet, clients/initial.parquet); it is neither checkpointed
        nor counted as a round."""
        assert self.executor is not None
        started, ctx = time.perf_counter(), self._context(-1, broadcast)
        targets = all_clients if self.config.engine.eval_clients == "all" else np.unique(ctx.sampled)
        calls = self._calls(broadcast, ctx, targets)
        with self._round_progress(len(calls.chunks), "initial evaluation") as bar:
            evals = self.executor.evaluate(calls, bar.update)
        seconds = time.perf_counter() - started
        record = summarise_round(-1, [], evals, {"evaluate": seconds, "round": seconds}, {})
        record.privacy = self.privacy.columns(ctx, {})
        clients = self.rounds.settle(-1, record, client_table(-1, [], evals))
        self.history.insert(0, record.as_row())
        _same_columns(self.history)
        for callback in self.callbacks:
            callback.on_initial_evaluation(self.view, record, clients)

    def _round(self, t: int, broadcast: Any, all_clients: np.ndarray) -> tuple[Any, bool]:
        assert self.executor is not None
        config, executor = self.config, self.executor
        started, ctx = time.perf_counter(), self._context(t, broadcast)
        sampled = ctx.sampled
        calls = self._calls(broadcast, ctx, sampled)
        with self._round_progress(len(calls.chunks), f"round {t} training") as bar:
            contributions, reports, new_states = executor.train(calls, bar.update)
        with interrupts_deferred():  # from here until the round is recorded and written, states change together
            for cid, state in new_states.items():
                self.states.put(cid, state)
            trained = time.perf_counter()
            extra = executor.aggregate(ctx, contributions)
            broadcast = executor.broadcast()
            aggregated = time.perf_counter()
            evals = []
            if (t + 1) % config.engine.eval_every == 0 or t == config.train.rounds - 1:
                targets = all_clients if config.engine.eval_clients == "all" else np.unique(sampled)  # each once
                calls = self._calls(broadcast, ctx, targets)
                with self._round_progress(len(calls.chunks), f"round {t} evaluation") as bar:
                    evals = executor.evaluate(calls, bar.update)
            finished = time.perf_counter()
            timings = {
                "train": trained - started,
                "aggregate": aggregated - trained,
                "evaluate": finished - aggregated,
                "round": finished - started,
            }
            record = summarise_round(t, reports, evals, timings, extra)
            record.privacy = self.privacy.columns(ctx, extra)
            clients = self.rounds.settle(t, record, client_table(t, reports, evals))
            self._warn_untrained(record, reports)
            self.history.append(record.as_row())
            _same_columns(self.history)
            stop = False
            for callback in self.callbacks:  # the metrics files and checkpoints of the round
                stop = callback.after_round(self.view, record, clients) or stop
        return broadcast, stop

    def _warn_untrained(self, record: RoundRecord, reports: Sequence[ClientReport]) -> None:
        """Say once per run that a round's updates were all left out, and what made them so (the progress bar and
        the summary say it of every such round; a round in which no client could step is warned about by
        ``summarise_round``)."""
        problem = record.loss_problem()
        if problem and record.num_rejected and not self._warned_untrained:
            self._warned_untrained = True
            logger.warning(
                "round %d: %s (%s), so the models did not change: %s; later rounds like it are counted in the summary",
                record.round,
                problem,
                "; ".join(sorted({report.rejected for report in reports if report.rejected})),
                untrained_cause(self.config, non_finite=any(r.rejected == NON_FINITE for r in reports)),
            )


def untrained_cause(config: RunConfig, *, non_finite: bool = True) -> str:
    """What to look at when client updates are rejected: for NaN or infinite ones, the method's local loss (its
    loss terms and their params) before the step size, since a term that gives NaN does so at any
    ``train.lr``; for ones beyond ``engine.max_update_norm``, the bound and the step size."""
    algorithm = config.algorithm
    method = f"algorithm.name={algorithm.name!r}" + (
        f" with algorithm.client={algorithm.client!r}" if algorithm.client else ""
    )
    if not non_finite:
        return f"raise engine.max_update_norm={config.engine.max_update_norm:g}, or lower train.lr={config.train.lr:g}"
    return (
        f"the local loss of {method} became NaN or infinite: look first at the method's loss terms and their "
        f"algorithm.params, then at the step size (train.lr={config.train.lr:g}: too large a step diverges)"
    )


def _shape_problem(checkpoint: Checkpoint, expected: Mapping[str, np.ndarray]) -> str | None:
    """What of ``checkpoint``'s server state is not the state this run's server keeps (names and shapes)."""
    for name, array in expected.items():
        saved = checkpoint.server.get(name)
        if saved is None or saved.shape != array.shape:
            found = "no array" if saved is None else f"shape {saved.shape}"
            return f"holds {found} for the server state {name!r}, but this run's server keeps shape {array.shape}"
    return None


def _same_columns(rows: list[dict[str, Any]]) -> None:
    """Give every row of the history the same keys (NaN where missing), so ``rounds.parquet`` keeps every
    column: the initial model's row has no server columns, and rows read from older runs may lack new ones."""
    keys = dict.fromkeys(key for row in rows for key in row)
    for row in rows:
        if len(row) != len(keys):
            for key in keys:
                row.setdefault(key, math.nan)


def run(
    config: RunConfig | Mapping[str, Any], *, callbacks: Sequence[Callback] = (), resume: bool = False
) -> RunResult:
    """Run ``config`` (or resume it from ``config.run_dir``) with ``callbacks`` and return its results.

    The engine adds no experiment tracker: ``rayfed.run`` (:func:`rayfed.tracking.run`) adds those
    ``engine.loggers`` names.

    ``config`` is a :class:`RunConfig` or a mapping of dotted field paths to values
    (``{"train.lr": 0.01}``), as :meth:`RunConfig.override` takes. With ``engine.backend="ray"``
    this joins the Ray cluster named by ``engine.ray_address`` / ``RAY_ADDRESS``, or starts a
    local one for the run.
    """
    refuse_run_while_importing()
    config = RunConfig.of(config)
    if training_backend(config.engine) == "local":  # a run of a pack on Ray too, in its pack's host
        return Simulation(config, callbacks=callbacks, resume=resume).run()
    from rayfed.actors import check_resources, ray_session

    plugins.check_shippable(config)  # what registered outside rayfed must reach the workers: said before Ray starts
    check_resources(config.engine)  # a Ray to be started here: this machine, before Ray starts
    with ray_session(config.engine, plugins.run_sources(config)):  # the Simulation checks the cluster, then writes
        return Simulation(config, callbacks=callbacks, resume=resume).run()
