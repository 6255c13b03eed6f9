"""Everything around training is a callback: metrics files, checkpoints, progress, tuning.

A callback overrides only the hooks it needs (the callback design of the pfl-research framework):

* ``on_run_start(sim)`` once, after the run directory, data and workers are ready;
* ``after_round(sim, record, clients)`` after every round; returning ``True`` stops the run
  (early stopping, a pruned Optuna trial);
* ``on_run_end(sim)`` once, also when the run stops early or fails.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pyarrow as pa

from rayfed.engine.metrics import RoundRecord
from rayfed.util.files import write_parquet

if TYPE_CHECKING:  # pragma: no cover
    from rayfed.engine import Simulation

__all__ = ["Callback", "MetricsWriter", "Checkpointer", "ProgressBar"]


class Callback:
    """Base class: every hook does nothing."""

    def on_run_start(self, sim: Simulation) -> None:
        """Called once before the first round (also when resuming)."""

    def after_round(self, sim: Simulation, record: RoundRecord, clients: pa.Table) -> bool:
        """Called after each round; return True to stop the run."""
        return False

    def on_run_end(self, sim: Simulation) -> None:
        """Called once when the run ends, however it ends."""


class MetricsWriter(Callback):
    """Writes ``rounds.parquet`` (rewritten atomically each round) and ``clients/round_XXXXXX.parquet``."""

    def after_round(self, sim: Simulation, record: RoundRecord, clients: pa.Table) -> bool:
        write_parquet(sim.run_dir / "clients" / f"round_{record.round:06d}.parquet", clients)
        self.write_rounds(sim)
        return False

    @staticmethod
    def write_rounds(sim: Simulation) -> None:
        """``rounds.parquet`` from the run's history (also before a checkpoint written on Ctrl-C)."""
        write_parquet(sim.run_dir / "rounds.parquet", pa.Table.from_pylist(sim.history))


class Checkpointer(Callback):
    """Saves a checkpoint every ``engine.checkpoint_every`` rounds and after the last round."""

    def after_round(self, sim: Simulation, record: RoundRecord, clients: pa.Table) -> bool:
        every = sim.config.engine.checkpoint_every
        last = record.round == sim.config.train.rounds - 1
        if every and ((record.round + 1) % every == 0 or last):
            sim.save_checkpoint(record.round)
        return False


class ProgressBar(Callback):
    """A tqdm bar over rounds with the latest pooled accuracy of the personalised models, the
    global model's beside it (``glob``, when the algorithm has one), the best accuracy so far,
    the training loss and the round's seconds."""

    def on_run_start(self, sim: Simulation) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(
            total=sim.config.train.rounds, initial=sim.start_round, desc=sim.run_name, unit="round", dynamic_ncols=True
        )
        self._best = max((r["accuracy"] for r in sim.history if not math.isnan(r["accuracy"])), default=math.nan)

    def after_round(self, sim: Simulation, record: RoundRecord, clients: pa.Table) -> bool:
        if not math.isnan(record.accuracy):
            self._best = record.accuracy if math.isnan(self._best) else max(self._best, record.accuracy)
            shown = {"acc": f"{record.accuracy:.4f}"}
            if not math.isnan(record.global_accuracy):
                shown["glob"] = f"{record.global_accuracy:.4f}"
            shown.update(best=f"{self._best:.4f}", loss=f"{record.train_loss:.3f}", s=f"{record.round_s:.2f}")
            self._bar.set_postfix(shown)
        self._bar.update(1)
        return False

    def on_run_end(self, sim: Simulation) -> None:
        if hasattr(self, "_bar"):
            self._bar.close()
