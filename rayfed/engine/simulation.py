"""The round loop, written once: sample, train on workers, aggregate, evaluate, log, checkpoint.

>>> from rayfed import RunConfig, run
>>> result = run(RunConfig().override({"train.rounds": 2, "engine.backend": "local"}))  # doctest: +SKIP
>>> result.best_accuracy  # doctest: +SKIP

A run directory holds::

    config.json              the RunConfig, as given
    partition.parquet        the exact client data sets (rows of client_id, split, index; or slice parameters)
    label_counts.parquet     each client's class counts (whole partition, train split)
    vocabulary.txt           token datasets only: the token of every id, one per line
    held_out.parquet         indices of the server's held-out samples, if the algorithm asks for any
    rounds.parquet           one row per round (accuracy, losses, timings, bytes); with engine.eval_initial
                             first a row round=-1: the initial model, before any training
    clients/round_*.parquet  one row per client per round (clients/initial.parquet: the initial model)
    checkpoints/round_*.npz  server state, client states and the round (no pickle)
    summary.json             best and final accuracy, rounds run
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from rayfed.algorithms import RoundContext, resolve
from rayfed.config import RunConfig
from rayfed.engine.callbacks import Callback, Checkpointer, MetricsWriter, ProgressBar
from rayfed.engine.checkpoint import checkpoint_round, newest_checkpoint, save_checkpoint
from rayfed.engine.inputs import RunInputs
from rayfed.engine.interrupts import RunInterrupted, interrupts_deferred
from rayfed.engine.metrics import client_table, summarise_round
from rayfed.engine.run_dir import (
    ResumePoint,
    check_creatable,
    check_same_run,
    make_run_dir,
    read_resume_point,
    resume_command,
    stale_client_tables,
)
from rayfed.engine.sizing import check_client_states, check_fits
from rayfed.engine.state_store import ClientStateStore
from rayfed.engine.trainability import check_trainable
from rayfed.execution.executor import Executor, LocalExecutor, make_chunks, num_calls
from rayfed.util.files import write_json, write_parquet
from rayfed.util.progress import progress_bar, progress_shown
from rayfed.util.seeding import sample_clients

logger = logging.getLogger(__name__)

__all__ = ["Simulation", "RunResult", "run"]

@dataclass(frozen=True)
class RunResult:
    """What a finished (or stopped) run returns; the run directory holds the rest."""

    run_dir: Path
    config: RunConfig
    history: list[dict[str, Any]]
    stopped_early: bool

    @property
    def rounds_run(self) -> int:
        """Training rounds recorded (the initial model's row, round -1, is not one)."""
        return sum(1 for r in self.history if r["round"] >= 0)

    @property
    def accuracies(self) -> list[float]:
        """Pooled accuracy after each training round (without the initial model's)."""
        return [r["accuracy"] for r in self.history if r["round"] >= 0]

    @property
    def best_accuracy(self) -> float:
        """Maximum over rounds of the pooled accuracy (how the papers report results)."""
        return max((a for a in self.accuracies if not math.isnan(a)), default=math.nan)

    @property
    def final_accuracy(self) -> float:
        return next((a for a in reversed(self.accuracies) if not math.isnan(a)), math.nan)


class Simulation:
    """One run: its directory, data, executor and round loop."""

    def __init__(self, config: RunConfig, *, callbacks: Sequence[Callback] = (), resume: bool = False) -> None:
        self.config = config
        self.algorithm = resolve(config.algorithm)
        self.run_dir = Path(config.run_dir or _default_run_dir(config))
        self.run_name = self.run_dir.name
        self.stopped_early = False
        builtin: list[Callback] = [MetricsWriter(), Checkpointer()]
        if config.engine.progress:
            builtin.append(ProgressBar())
        self.callbacks = [*builtin, *callbacks]
        # Everything that can be wrong with the input is checked before anything is written: the run
        # directory and, when a run continues in it, every file it reads (rayfed.engine.run_dir); then whether
        # the run fits (workers, memory) before any data is made.
        check_creatable(self.run_dir)
        self.continues = check_same_run(self.run_dir, config, resume=resume)
        """Whether the run directory holds this run already (resumed, or started again: no round saved)."""
        point = read_resume_point(self.run_dir) if self.continues else ResumePoint(None)
        self._checkpoint = point.checkpoint
        self.history: list[dict[str, Any]] = list(point.history)
        self.start_round = point.next_round
        check_fits(config)
        check_client_states(config, self.run_dir)  # APPLE's states grow as clients squared
        with progress_shown(config.engine.progress):
            inputs = RunInputs.prepare(config, self.algorithm, self.run_dir, continues=self.continues)
        self.dataset, self.spec, self.initial, self.partition = (
            inputs.dataset, inputs.spec, inputs.initial, inputs.partition
        )
        self.num_train = self.partition.num_train()
        check_trainable(self.num_train, config.train)
        make_run_dir(self.run_dir)
        write_json(self.run_dir / "config.json", config.to_dict())
        inputs.write(self.run_dir)
        self.states = ClientStateStore(
            self.run_dir / "client_state", int(config.engine.client_state_memory_mb * 2**20)
        )
        self.executor: Executor | None = None

    # --- run directory ---------------------------------------------------------------------
    # --- checkpoints -----------------------------------------------------------------------
    def save_checkpoint(self, round_index: int) -> Path:
        """Server state, client states and the round (:mod:`rayfed.engine.checkpoint`)."""
        assert self.executor is not None
        clients = ((cid, self.states.get(cid) or {}) for cid in self.states.ids())
        return save_checkpoint(self.run_dir, round_index, self.executor.server_state(), clients)

    def _restore(self) -> None:
        """Load the checkpoint read (and checked) in ``__init__``; drop the per-client tables of rounds to run again."""
        assert self.executor is not None
        for stale in stale_client_tables(self.run_dir, self.start_round):
            stale.unlink()
        if self._checkpoint is None:
            if self.continues:
                logger.info("%s holds no completed round; starting it again from round 0", self.run_dir)
            return
        self.executor.load_server_state(self._checkpoint.server)
        self.states.clear()
        for cid, state in self._checkpoint.clients.items():
            self.states.put(cid, state)
        self._checkpoint = None  # its arrays now live in the executor and the store
        logger.info("resumed %s after round %d", self.run_dir, self.start_round - 1)

    def _interrupted(self) -> RunInterrupted:
        """Ctrl-C: checkpoint the last recorded round, unless the newest checkpoint holds it already.

        The states belong to that round: a round changes them only inside ``interrupts_deferred``.
        """
        done = self.history[-1]["round"] if self.history else None
        newest = newest_checkpoint(self.run_dir)
        if done is not None and (newest is None or checkpoint_round(newest) < done):
            MetricsWriter.write_rounds(self)  # a resume needs every round up to the checkpoint's
            self.save_checkpoint(done)
        return RunInterrupted(self.run_dir, done, self.config.train.rounds, resume_command(self.run_dir))

    # --- the loop ----------------------------------------------------------------------------
    def _make_executor(self) -> Executor:
        args = (self.config, self.spec, self.dataset, self.partition, self.initial)
        if self.config.engine.backend == "local":
            return LocalExecutor(*args)
        from rayfed.actors import RayExecutor

        return RayExecutor(*args)

    def _chunks(self, client_ids: np.ndarray) -> list[list[int]]:
        """The clients' batches, one per worker call: the same on every backend and number of workers."""
        return make_chunks(client_ids, self.num_train, num_calls(len(client_ids), self.config.engine.clients_per_call))

    def run(self) -> RunResult:
        """Run the remaining rounds; the executor is released however the loop ends."""
        config = self.config
        self.executor = self._make_executor()
        try:
            self._restore()
            for callback in self.callbacks:
                callback.on_run_start(self)
            broadcast = self.executor.broadcast()
            all_clients = np.arange(config.data.num_clients, dtype=np.int64)
            if config.engine.eval_initial and self.start_round == 0 and not any(r["round"] < 0 for r in self.history):
                self._evaluate_initial(broadcast, all_clients)
            for t in range(self.start_round, config.train.rounds):
                broadcast, stop = self._round(t, broadcast, all_clients)
                if stop:
                    self.stopped_early = True
                    break
            result = RunResult(self.run_dir, config, self.history, self.stopped_early)
            write_json(
                self.run_dir / "summary.json",
                {"best_accuracy": result.best_accuracy, "final_accuracy": result.final_accuracy,
                 "rounds_run": result.rounds_run, "stopped_early": self.stopped_early},
            )
            return result
        except KeyboardInterrupt:
            raise self._interrupted() from None
        finally:
            for callback in self.callbacks:
                callback.on_run_end(self)
            self.executor.close()

    def _round_progress(self, batches: int, desc: str) -> Any:
        """A bar over the round's client batches; it appears only in rounds long enough to need one."""
        with progress_shown(self.config.engine.progress):
            return progress_bar(batches, desc, "batch")

    def _evaluate_initial(self, broadcast: Any, all_clients: np.ndarray) -> None:
        """``engine.eval_initial``: evaluate the initial model as the papers' code does before its first
        round, recorded as round -1 (rounds.parquet, clients/initial.parquet); no callback sees it, so it
        is neither checkpointed nor counted as a round."""
        assert self.executor is not None
        config, started = self.config, time.perf_counter()
        sampled = sample_clients(config.seed, 0, config.data.num_clients, config.engine.join_ratio)
        targets = all_clients if config.engine.eval_clients == "all" else sampled
        ctx = RoundContext(round=-1, seed=config.seed, lr=config.train.lr_at(0), sampled=sampled,
                           num_clients=config.data.num_clients)
        chunks = self._chunks(targets)
        keeps_state = self.algorithm.keeps_client_state
        with self._round_progress(len(chunks), "initial evaluation") as bar:
            evals = self.executor.evaluate(
                broadcast, ctx, chunks, self.states.get_many(targets) if keeps_state else {}, bar.update
            )
        seconds = time.perf_counter() - started
        record = summarise_round(-1, [], evals, {"evaluate": seconds, "round": seconds}, {})
        self.history.insert(0, record.as_row())
        _same_columns(self.history)
        write_parquet(self.run_dir / "clients" / "initial.parquet", client_table(-1, [], evals))
        MetricsWriter.write_rounds(self)

    def _round(self, t: int, broadcast: Any, all_clients: np.ndarray) -> tuple[Any, bool]:
        assert self.executor is not None
        config, executor = self.config, self.executor
        started = time.perf_counter()
        sampled = sample_clients(config.seed, t, config.data.num_clients, config.engine.join_ratio)
        ctx = RoundContext(round=t, seed=config.seed, lr=config.train.lr_at(t), sampled=sampled,
                           num_clients=config.data.num_clients)
        keeps_state = self.algorithm.keeps_client_state
        chunks = self._chunks(sampled)
        with self._round_progress(len(chunks), f"round {t} training") as bar:
            contributions, reports, new_states = executor.train(
                broadcast, ctx, chunks, self.states.get_many(sampled) if keeps_state else {}, bar.update
            )
        with interrupts_deferred():  # from here until the round is recorded and written, states change together
            for cid, state in new_states.items():
                self.states.put(cid, state)
            trained = time.perf_counter()
            extra = executor.aggregate(ctx, contributions)
            broadcast = executor.broadcast()
            aggregated = time.perf_counter()
            evals = []
            if (t + 1) % config.engine.eval_every == 0 or t == config.train.rounds - 1:
                targets = all_clients if config.engine.eval_clients == "all" else sampled
                chunks = self._chunks(targets)
                with self._round_progress(len(chunks), f"round {t} evaluation") as bar:
                    evals = executor.evaluate(
                        broadcast, ctx, chunks, self.states.get_many(targets) if keeps_state else {}, bar.update
                    )
            finished = time.perf_counter()
            timings = {"train": trained - started, "aggregate": aggregated - trained, "evaluate": finished - aggregated,
                       "round": finished - started}
            record = summarise_round(t, reports, evals, timings, extra)
            self.history.append(record.as_row())
            _same_columns(self.history)
            clients = client_table(t, reports, evals)
            stop = False
            for callback in self.callbacks:  # the metrics files and checkpoints of the round
                stop = callback.after_round(self, record, clients) or stop
        return broadcast, stop


def _same_columns(rows: list[dict[str, Any]]) -> None:
    """Give every row of the history the same keys (NaN where missing), so ``rounds.parquet`` keeps every
    column: the initial model's row has no server columns, and rows read from older runs may lack new ones."""
    keys = dict.fromkeys(key for row in rows for key in row)
    for row in rows:
        if len(row) != len(keys):
            for key in keys:
                row.setdefault(key, math.nan)


def _default_run_dir(config: RunConfig) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return f"runs/{config.algorithm.name}-{config.data.dataset}-s{config.seed}-{stamp}"


def run(config: RunConfig, *, callbacks: Sequence[Callback] = (), resume: bool = False) -> RunResult:
    """Run ``config`` (or resume it from ``config.run_dir``) and return its results.

    With ``engine.backend="ray"`` this joins the Ray cluster named by
    ``engine.ray_address`` / ``RAY_ADDRESS``, or starts a local one for the run.
    """
    if config.engine.backend == "local":
        return Simulation(config, callbacks=callbacks, resume=resume).run()
    from rayfed.actors import check_resources, ray_session

    check_resources(config.engine)  # a Ray to be started here: this machine, before Ray starts
    with ray_session(config.engine):  # the Simulation checks the cluster once Ray is up, before writing
        return Simulation(config, callbacks=callbacks, resume=resume).run()
