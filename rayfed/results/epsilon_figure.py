"""Final accuracy against the ε a run spent, one line per method (docs/privacy.md, "What the examples show"): the
figure of a privacy sweep, where each method ran without privacy and at several noise multipliers on the same
clients. ``rayfed plot`` draws each run's accuracy against its ε round by round; this draws one point per run.

matplotlib is imported lazily (``pip install 'rayfed[plots]'``), on a ``Figure`` object: no pyplot state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from rayfed.util.files import atomic_write

__all__ = ["plot_accuracy_vs_epsilon"]


def plot_accuracy_vs_epsilon(
    points: Mapping[str, Sequence[tuple[float, float]]], path: str | Path, *, delta: float
) -> Path:
    """``path``: for each method of ``points``, its runs' (ε, final accuracy) on a logarithmic ε axis, a run
    without privacy (ε = inf) drawn at twice the largest finite ε and said so on the axis."""
    from matplotlib.figure import Figure

    finite = [eps for runs in points.values() for eps, _ in runs if math.isfinite(eps)]
    right = 2 * max(finite) if finite else 1.0
    figure = Figure(figsize=(6, 4))
    axes = figure.add_subplot()
    for method, runs in points.items():
        drawn = sorted((eps if math.isfinite(eps) else right, accuracy) for eps, accuracy in runs)
        axes.plot([x for x, _ in drawn], [y for _, y in drawn], marker="o", label=method)
    axes.set_xscale("log")
    axes.set_xlabel(f"epsilon at delta={delta:g} (no privacy drawn at {right:.3g})")
    axes.set_ylabel("final pooled test accuracy")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    out = Path(path)
    atomic_write(out, lambda tmp: figure.savefig(tmp, format="png", dpi=120))
    return out
