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

    @property
    def unreported(self) -> str | None:
        """With a system model, why no client's work reached the server in any round (each one dropped out, went
        offline or was late: docs/system.md), or None if some did, or the run models no devices."""
        system = self.config.system
        rounds = [r for r in self.history if r["round"] >= 0]
        if not system.enabled or not rounds or any(_counted(r) for r in rounds):
            return None
        lost = {status: int(sum(r.get(f"clients_{status}", 0) for r in rounds)) for status in _LOST}
        causes = ", ".join(f"{count} {_LOST[status]}" for status, count in lost.items() if count)
        return (
            f"no client's work reached the server in any of the {len(rounds)} rounds ({causes or 'none sampled'}), "
            f"so the models never changed: with system.dropout={system.dropout:g}, "
            f"system.availability={system.availability!r} and system.deadline_s={system.deadline_s}, give the clients "
            "longer online windows, lower system.dropout or raise system.deadline_s (docs/system.md)"
        )


_LOST = {
    "dropped": "dropped out",
    "offline": "went offline before they finished",
    "late": "were late",
}
"""The statuses of a sampled client whose work never reaches the server, and what each says."""


def _counted(row: dict[str, Any]) -> bool:
    """Whether a round's server received some client's work (a finished or partial one)."""
    return bool(row.get("clients_finished", 0) or row.get("clients_partial", 0))
