"""Everything around training is a callback: metrics files, checkpoints, progress, tuning.

A callback overrides only the hooks it needs (the callback design of the pfl-research framework),
and sees the run through a :class:`RunView`: its directory, config, problem and history, and the
state a checkpoint saves, not the machinery that trains it.

* ``before_run(run, continues)`` once the run is planned, before anything is written: a callback whose
  own files or services cannot take the run refuses it here;
* ``on_run_start(run)`` once, after the run directory, data and workers are ready;
* ``on_initial_evaluation(run, record, clients)`` after the initial model is evaluated
  (``engine.eval_initial``; round -1, which is neither a round nor checkpointed);
* ``after_round(run, record, clients)`` after every round; returning ``True`` stops the run
  (early stopping, a pruned Optuna trial);
* ``on_interrupt(run)`` when Ctrl-C stops the run, after the last round was recorded whole;
* ``on_run_end(run, result)`` once, however the run ends; ``result`` is None unless it finished
  (all its rounds, or stopped early by a callback).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rayfed.engine.checkpoint import checkpoint_round, newest_checkpoint, save_checkpoint
from rayfed.engine.metrics import RoundRecord
from rayfed.engine.privacy_records import privacy_summary
from rayfed.scheduling.system_records import PARTICIPATION_FILE, device_tables, participation, system_summary
from rayfed.system.profiles import DeviceProfiles
from rayfed.train.job import ClientState
from rayfed.train.problem import ProblemSpec
from rayfed.util.files import write_json, write_parquet

if TYPE_CHECKING:  # pragma: no cover
    from rayfed.config import RunConfig
    from rayfed.engine.result import RunResult

__all__ = ["RunView", "Callback", "MetricsWriter", "Checkpointer", "ProgressBar"]


@dataclass(frozen=True)
class RunView:
    """What a callback sees of a run (read only)."""

    run_dir: Path
    config: RunConfig
    spec: ProblemSpec
    identity: str
    """The run's identity (:mod:`rayfed.provenance.run_identity`), which its checkpoints record."""
    start_round: int
    """The first round this process runs (after the checkpoint it resumed from, else 0)."""
    rows: Callable[[], Sequence[Mapping[str, Any]]]
    state: Callable[[], tuple[dict[str, np.ndarray], Iterator[tuple[int, ClientState]]]]
    system_state: Callable[[], dict[str, np.ndarray]] = dict
    """What the run's system model saves of its rounds (:meth:`rayfed.scheduling.sync_rounds.Rounds.state`)."""
    devices: DeviceProfiles | None = None
    """The clients' devices the run's system model drew (None without one)."""

    @property
    def run_name(self) -> str:
        return self.run_dir.name

    @property
    def history(self) -> Sequence[Mapping[str, Any]]:
        """One row per recorded round, as ``rounds.parquet`` holds them (the initial model's first, if any)."""
        return self.rows()

    def server_state(self) -> dict[str, np.ndarray]:
        """The server half's state now (``ServerHalf.state_dict``)."""
        return self.state()[0]

    def client_states(self) -> Iterator[tuple[int, ClientState]]:
        """(client id, state) of every client that keeps one, read from the client state store one at a time."""
        return self.state()[1]


class Callback:
    """Base class: every hook does nothing."""

    def before_run(self, run: RunView, continues: bool) -> None:
        """Called once the run passed its plan's checks and before anything is written (``continues``: the run
        directory holds this run already; ``run.history``, the rounds it resumes after); raise a
        :class:`~rayfed.util.errors.RayfedError` naming the fix to refuse the run with every file of its
        directory as it was."""

    def on_run_start(self, run: RunView) -> None:
        """Called once before the first round (also when resuming)."""

    def on_initial_evaluation(self, run: RunView, record: RoundRecord, clients: pa.Table) -> None:
        """Called after the initial model is evaluated (``engine.eval_initial``)."""

    def after_round(self, run: RunView, record: RoundRecord, clients: pa.Table) -> bool:
        """Called after each round; return True to stop the run."""
        return False

    def on_interrupt(self, run: RunView) -> None:
        """Called when Ctrl-C stops the run; every recorded round is whole."""

    def on_run_end(self, run: RunView, result: RunResult | None) -> None:
        """Called once when the run ends, however it ends; ``result`` is None unless it finished."""


class MetricsWriter(Callback):
    """Writes ``rounds.parquet`` (rewritten atomically each round), ``clients/round_XXXXXX.parquet``,
    ``clients/initial.parquet`` and, when the run finishes, ``summary.json`` (and with a system model the drawn
    devices when it starts and ``participation.parquet`` when it finishes: :mod:`rayfed.scheduling.system_records`)."""

    def on_run_start(self, run: RunView) -> None:
        if run.devices is not None:  # the devices the run drew (docs/system.md, "What a run records")
            for name, table in device_tables(run.devices).items():
                write_parquet(run.run_dir / name, table)

    def on_initial_evaluation(self, run: RunView, record: RoundRecord, clients: pa.Table) -> None:
        write_parquet(run.run_dir / "clients" / "initial.parquet", clients)
        self.write_rounds(run)

    def after_round(self, run: RunView, record: RoundRecord, clients: pa.Table) -> bool:
        write_parquet(run.run_dir / "clients" / f"round_{record.round:06d}.parquet", clients)
        self.write_rounds(run)
        return False

    def on_interrupt(self, run: RunView) -> None:
        if run.history:  # the checkpoint written next needs every round up to its own
            self.write_rounds(run)

    def on_run_end(self, run: RunView, result: RunResult | None) -> None:
        if result is not None:
            write_json(
                run.run_dir / "summary.json",
                {
                    "best_accuracy": result.best_accuracy,
                    "final_accuracy": result.final_accuracy,
                    "rounds_run": result.rounds_run,
                    "stopped_early": result.stopped_early,
                    "rounds_without_finite_loss": result.rounds_without_loss,
                    **system_summary(run.history, run.config.system),
                    **privacy_summary(run.history, run.config),
                },
            )
            if run.config.system.enabled:  # who the deadline (or the schedule) left out
                write_parquet(run.run_dir / PARTICIPATION_FILE, participation(run.run_dir, run.config.data.num_clients))

    @staticmethod
    def write_rounds(run: RunView) -> None:
        """``rounds.parquet`` from the run's history."""
        write_parquet(run.run_dir / "rounds.parquet", pa.Table.from_pylist(list(run.history)))


class Checkpointer(Callback):
    """Saves a checkpoint every ``engine.checkpoint_every`` rounds and after the last round, and on Ctrl-C
    one of the last recorded round, unless the newest checkpoint holds it already."""

    def after_round(self, run: RunView, record: RoundRecord, clients: pa.Table) -> bool:
        every = run.config.engine.checkpoint_every
        last = record.round == run.config.train.rounds - 1
        if every and ((record.round + 1) % every == 0 or last):
            self.save(run, record.round)
        return False

    def on_interrupt(self, run: RunView) -> None:
        """The states belong to the last recorded round: a round changes them only inside
        ``interrupts_deferred``, together with its record."""
        rounds = [row["round"] for row in run.history if row["round"] >= 0]
        newest = newest_checkpoint(run.run_dir)
        if rounds and (newest is None or checkpoint_round(newest) < rounds[-1]):
            self.save(run, rounds[-1])

    @staticmethod
    def save(run: RunView, round_index: int) -> Path:
        """Server state, client states and the round (:mod:`rayfed.engine.checkpoint`)."""
        server, clients = run.state()
        return save_checkpoint(run.run_dir, round_index, server, clients, run.identity, run.system_state())


class ProgressBar(Callback):
    """A tqdm bar over rounds with the latest pooled accuracy of the personalised models, the
    global model's beside it (``glob``, when the algorithm has one), the best accuracy so far,
    the training loss (or why the round has none: e.g. ``all 10 client updates rejected``) and
    the round's seconds; in a log (no terminal), the same as one line per round
    (:func:`rayfed.util.progress.steps`). With ``lines``, one line per round on a terminal too: the progress
    of runs that share the terminal (a study's parallel trials), whose bars would overwrite each other."""

    def __init__(self, *, lines: bool = False) -> None:
        self.lines = lines

    def on_run_start(self, run: RunView) -> None:
        from rayfed.util.progress import steps

        self._bar = steps(run.config.train.rounds, run.run_name, "round", initial=run.start_round, lines=self.lines)
        self._best = max((r["accuracy"] for r in run.history if not math.isnan(r["accuracy"])), default=math.nan)

    def after_round(self, run: RunView, record: RoundRecord, clients: pa.Table) -> bool:
        problem = record.loss_problem()
        if not math.isnan(record.accuracy) or problem:
            shown = {}
            if not math.isnan(record.accuracy):
                self._best = record.accuracy if math.isnan(self._best) else max(self._best, record.accuracy)
                shown["acc"] = f"{record.accuracy:.4f}"
                if not math.isnan(record.global_accuracy):
                    shown["glob"] = f"{record.global_accuracy:.4f}"
                shown["best"] = f"{self._best:.4f}"
            shown.update(loss=problem or f"{record.train_loss:.3f}", s=f"{record.round_s:.2f}")
            self._bar.set_postfix(shown)
        self._bar.update(1)
        return False

    def on_run_end(self, run: RunView, result: RunResult | None) -> None:
        if hasattr(self, "_bar"):
            self._bar.close()
