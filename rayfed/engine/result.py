"""What a finished (or stopped) run returns: its directory, config and per-round history, and the figures
read from them (:class:`RunResult`). The callbacks see it at a run's end, the Optuna objective reads it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayfed.config import RunConfig

__all__ = ["RunResult"]


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

    @property
    def rounds_without_loss(self) -> list[int]:
        """Training rounds without a finite training loss: every update rejected (NaN or infinite, or
        beyond ``engine.max_update_norm``), or no client took a step; the models did not change in them."""
        return [r["round"] for r in self.history if r["round"] >= 0 and not math.isfinite(r["train_loss"])]

    @property
    def trained(self) -> bool:
        """Whether any round produced a finite training loss (``rayfed run`` exits with 1 when none did)."""
        return self.rounds_run > len(self.rounds_without_loss)
