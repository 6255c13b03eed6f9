"""The round loop, written once: sample, train on workers, aggregate, evaluate, log, checkpoint.

>>> from rayfed import RunConfig, run
>>> result = run(RunConfig().override({"train.rounds": 2, "engine.backend": "local"}))  # doctest: +SKIP
>>> result.best_accuracy  # doctest: +SKIP

A run directory holds::

    config.json              the RunConfig, as given
    partition.parquet        (client_id, split, index): the exact client data sets
    label_counts.parquet     each client's class counts (whole partition, train split)
    rounds.parquet           one row per round (accuracy, losses, timings, bytes)
    clients/round_*.parquet  one row per client per round
    checkpoints/round_*.npz  server state, client states and the round (no pickle)
    summary.json             best and final accuracy, rounds run
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from rayfed.algorithms import RoundContext, resolve
from rayfed.callbacks import Callback, Checkpointer, MetricsWriter, ProgressBar
from rayfed.checkpoint import checkpoint_round, load_checkpoint, newest_checkpoint, save_checkpoint
from rayfed.config import RunConfig
from rayfed.data import LABEL_COUNTS_FILE, Partition, load_dataset, make_partition, write_label_counts
from rayfed.errors import CheckpointError, ConfigError
from rayfed.executor import Executor, LocalExecutor, make_chunks
from rayfed.io import write_json
from rayfed.metrics import client_table, summarise_round
from rayfed.problem import build_problem
from rayfed.seeding import sample_clients
from rayfed.state_store import ClientStateStore

logger = logging.getLogger(__name__)

__all__ = ["Simulation", "RunResult", "run"]

_RESUMABLE = ("train.rounds", "engine.", "run_dir")
"""Config paths that may change when a run resumes: they do not change its results."""


@dataclass(frozen=True)
class RunResult:
    """What a finished (or stopped) run returns; the run directory holds the rest."""

    run_dir: Path
    config: RunConfig
    history: list[dict[str, Any]]
    stopped_early: bool

    @property
    def rounds_run(self) -> int:
        return len(self.history)

    @property
    def accuracies(self) -> list[float]:
        return [r["accuracy"] for r in self.history]

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
        self.resume = resume
        self._resume_from: tuple[Path, int] | None = None
        """(newest checkpoint, its round), set when the run directory is checked for a resume."""
        self.history: list[dict[str, Any]] = []
        self.start_round = 0
        self.stopped_early = False
        builtin: list[Callback] = [MetricsWriter(), Checkpointer()]
        if config.engine.progress:
            builtin.append(ProgressBar())
        self.callbacks = [*builtin, *callbacks]
        # Everything that can be wrong with the input is checked before anything is written.
        self._check_run_dir()
        self.dataset = load_dataset(
            config.data.dataset,
            config.data.root,
            download=config.data.download,
            seed=config.data.seed,
            options=config.data.options,
        )
        self.spec, self.initial = build_problem(config, self.dataset)
        self.algorithm.validate(self.spec)
        self.partition = self._partition()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.run_dir / "config.json", config.to_dict())
        if not (self.run_dir / "partition.parquet").exists():
            self.partition.save(self.run_dir / "partition.parquet")
        if not (self.run_dir / LABEL_COUNTS_FILE).exists():  # p_i per client, for `rayfed plot`
            write_label_counts(self.run_dir / LABEL_COUNTS_FILE, self.partition, self.dataset.input_shape)
        self.num_train = self.partition.num_train()
        self.states = ClientStateStore(
            self.run_dir / "client_state", int(config.engine.client_state_memory_mb * 2**20)
        )
        self.executor: Executor | None = None

    # --- run directory ---------------------------------------------------------------------
    def _check_run_dir(self) -> None:
        """Resuming needs a run here; a new run must not overwrite one."""
        saved = self.run_dir / "config.json"
        if self.resume:
            if not saved.is_file():
                raise CheckpointError(
                    f"cannot resume: {str(self.run_dir)!r} holds no run (no config.json); "
                    "start a new run instead, or point run_dir at an existing run directory"
                )
            _check_resumable(RunConfig.from_dict(json.loads(saved.read_text())), self.config)
            newest = newest_checkpoint(self.run_dir)
            if newest is None:
                raise CheckpointError(
                    f"cannot resume: {str(self.run_dir)!r} holds no checkpoint yet (engine.checkpoint_every="
                    f"{self.config.engine.checkpoint_every}); start it again without --resume"
                )
            self._resume_from = (newest, checkpoint_round(newest))
        elif saved.exists():
            raise ConfigError(
                f"run_dir={str(self.run_dir)!r} already holds a run; resume it (rayfed run --resume "
                f"{self.run_dir}) or choose another run_dir, so its results are not overwritten"
            )

    def _partition(self) -> Partition:
        path = self.run_dir / "partition.parquet"
        if self.resume and path.exists():
            return Partition.load(path, self.dataset.labels, self.dataset.num_classes)
        return make_partition(self.dataset.labels, self.dataset.num_classes, self.config.data)

    # --- checkpoints -----------------------------------------------------------------------
    def save_checkpoint(self, round_index: int) -> Path:
        """Server state, client states and the round (:mod:`rayfed.checkpoint`)."""
        assert self.executor is not None
        clients = ((cid, self.states.get(cid) or {}) for cid in self.states.ids())
        return save_checkpoint(self.run_dir, round_index, self.executor.server_state(), clients)

    def _restore(self) -> None:
        """Load the newest checkpoint and cut the metrics back to it."""
        assert self.executor is not None and self._resume_from is not None
        newest, round_index = self._resume_from  # checked before anything was written
        checkpoint = load_checkpoint(newest)
        self.executor.load_server_state(checkpoint.server)
        self.states.clear()
        for cid, state in checkpoint.clients.items():
            self.states.put(cid, state)
        rounds_file = self.run_dir / "rounds.parquet"
        if rounds_file.exists():
            self.history = [r for r in pq.read_table(rounds_file).to_pylist() if r["round"] <= round_index]
        for stale in (self.run_dir / "clients").glob("round_*.parquet"):
            if int(stale.stem.split("_")[1]) > round_index:
                stale.unlink()
        self.start_round = round_index + 1
        logger.info("resumed %s after round %d", self.run_dir, round_index)

    # --- the loop ----------------------------------------------------------------------------
    def _make_executor(self) -> Executor:
        args = (self.config, self.spec, self.dataset, self.partition, self.initial)
        if self.config.engine.backend == "local":
            return LocalExecutor(*args)
        from rayfed.actors import RayExecutor

        return RayExecutor(*args)

    def _chunks(self, client_ids: np.ndarray) -> list[list[int]]:
        assert self.executor is not None
        per_call = self.config.engine.clients_per_call
        count = -(-len(client_ids) // per_call) if per_call else 2 * self.executor.num_workers
        return make_chunks(client_ids, self.num_train, count)

    def run(self) -> RunResult:
        """Run the remaining rounds; the executor is released however the loop ends."""
        config = self.config
        self.executor = self._make_executor()
        try:
            if self.resume:
                self._restore()
            for callback in self.callbacks:
                callback.on_run_start(self)
            broadcast = self.executor.broadcast()
            all_clients = np.arange(config.data.num_clients, dtype=np.int64)
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
        finally:
            for callback in self.callbacks:
                callback.on_run_end(self)
            self.executor.close()

    def _round(self, t: int, broadcast: Any, all_clients: np.ndarray) -> tuple[Any, bool]:
        assert self.executor is not None
        config, executor = self.config, self.executor
        started = time.perf_counter()
        sampled = sample_clients(config.seed, t, config.data.num_clients, config.engine.join_ratio)
        ctx = RoundContext(round=t, seed=config.seed, lr=config.train.lr_at(t), sampled=sampled,
                           num_clients=config.data.num_clients)
        keeps_state = self.algorithm.keeps_client_state
        contributions, reports, new_states = executor.train(
            broadcast, ctx, self._chunks(sampled), self.states.get_many(sampled) if keeps_state else {}
        )
        for cid, state in new_states.items():
            self.states.put(cid, state)
        trained = time.perf_counter()
        extra = executor.aggregate(ctx, contributions)
        broadcast = executor.broadcast()
        aggregated = time.perf_counter()
        evals = []
        if (t + 1) % config.engine.eval_every == 0 or t == config.train.rounds - 1:
            targets = all_clients if config.engine.eval_clients == "all" else sampled
            evals = executor.evaluate(
                broadcast, ctx, self._chunks(targets), self.states.get_many(targets) if keeps_state else {}
            )
        finished = time.perf_counter()
        timings = {"train": trained - started, "aggregate": aggregated - trained, "evaluate": finished - aggregated,
                   "round": finished - started}
        record = summarise_round(t, reports, evals, timings, extra)
        self.history.append(record.as_row())
        clients = client_table(t, reports, evals)
        stop = False
        for callback in self.callbacks:
            stop = callback.after_round(self, record, clients) or stop
        return broadcast, stop


def _default_run_dir(config: RunConfig) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return f"runs/{config.algorithm.name}-{config.data.dataset}-s{config.seed}-{stamp}"


def _check_resumable(saved: RunConfig, new: RunConfig) -> None:
    """A run resumes only with the config it started with (more rounds and another engine layout are fine)."""
    changed = saved.diff(new, ignore=_RESUMABLE)
    if changed:
        raise ConfigError(
            f"cannot resume with a different config ({', '.join(changed)}); only train.rounds and engine.* may change"
        )


def run(config: RunConfig, *, callbacks: Sequence[Callback] = (), resume: bool = False) -> RunResult:
    """Run ``config`` (or resume it from ``config.run_dir``) and return its results.

    With ``engine.backend="ray"`` this joins the Ray cluster named by
    ``engine.ray_address`` / ``RAY_ADDRESS``, or starts a local one for the run.
    """
    simulation = Simulation(config, callbacks=callbacks, resume=resume)
    if config.engine.backend == "local":
        return simulation.run()
    from rayfed.actors import ray_session

    with ray_session(config.engine):
        return simulation.run()
