"""How close ``rayfed reproduce --plan``'s estimate comes to the run it plans.

    python benchmarks/plan_check.py [--table fedawa-mnist] [--methods fedavg_m,fedawa_code] [--columns offline]
        [--rounds 10] [--seeds 1] [--set data.options.num_samples=20000]

Plans the cells (calibrating each row x column by two rounds, as ``--plan`` does), then runs them, one after
the other in this process as ``rayfed reproduce`` does without ``--parallel``, into a fresh folder, timing each
from its start to its last round written. Prints each cell's estimate and measurement and, last,
``plan_error=<|estimate - measured| / measured, all cells together> worst_cell_error=<the same, worst cell>
cells=<n> estimate_s=<s> measured_s=<s>``.
The default cells need no download (the offline dataset).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rayfed.config import parse_override
from rayfed.reproduce import TABLES
from rayfed.reproduce.costing import cell_costs, shape_costs
from rayfed.reproduce.runner import Cell, Outcome, execute, plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", default="fedawa-mnist")
    parser.add_argument("--methods", default="fedavg_m,fedawa_code")
    parser.add_argument("--columns", default="offline")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="FIELD=VALUE")
    args = parser.parse_args()
    settings = dict(parse_override(text) for text in args.settings)
    with tempfile.TemporaryDirectory(prefix="plan-check-") as out:
        cells = plan(
            TABLES[args.table],
            Path(out),
            rounds=args.rounds,
            seeds=list(range(args.seeds)),
            rows=args.methods.split(","),
            columns=args.columns.split(","),
            settings=settings,
        )
        estimates = {item.cell: item.seconds for item in cell_costs(cells, shape_costs(cells), args.rounds)}
        measured: dict[Cell, float] = {}
        started = time.perf_counter()

        def done(cell: Cell, outcome: Outcome) -> None:
            nonlocal started
            measured[cell] = time.perf_counter() - started
            started = time.perf_counter()

        execute(cells, on_done=done)
    print(f"{'row':16s} {'column':10s} {'seed':>4s} {'estimate_s':>10s} {'measured_s':>10s} {'ratio':>6s}")
    errors = []
    for cell, seconds in measured.items():
        estimate = estimates[cell] or float("nan")
        errors.append(abs(estimate - seconds) / seconds)
        print(
            f"{cell.row.key:16s} {cell.column.key:10s} {cell.seed:4d} {estimate:10.1f} {seconds:10.1f} "
            f"{estimate / seconds:6.2f}"
        )
    estimate_s, measured_s = sum(estimates[c] or 0.0 for c in measured), sum(measured.values())
    print(
        f"plan_error={abs(estimate_s - measured_s) / measured_s:.3f} worst_cell_error={max(errors):.3f} "
        f"cells={len(measured)} estimate_s={estimate_s:.1f} measured_s={measured_s:.1f}"
    )


if __name__ == "__main__":
    main()
