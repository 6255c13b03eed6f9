"""A run-round's time with K seeds packed into one stack (``rayfed.run_many``) against one run alone, and what that
makes of P-ICCV Table 1's MNIST column at the papers' horizon.

The run is the FedAvg cell of ``rayfed reproduce cwfedavg-iccv-t1``'s ``prac_mnist`` column (the ``cwfedavg-mnist``
preset: cnn4, 20 clients, Dirichlet 0.1, batch 10, lr 0.005, one epoch, every client trained and evaluated every
round, the training loss evaluated too), on one GPU in this process (``engine.backend=local``, stacked:
``engine.vectorize=on``, CUDA graphs as the default; a round's clients in the cell's 8 calls, each a stack, which
packed runs merge with the other runs' concurrent calls), on real MNIST from ``--data-root``, else on ``gpu.py``'s
synthetic stand-in with MNIST's 70,000 samples. One run (seed 1) trains ``--warmup`` rounds (the first capture the
CUDA graphs) and then ``--rounds`` timed rounds; then K runs (``--runs``, seeds 1 to K, the same partition: a
table's seeds keep the preset's ``data.seed``) train the same rounds packed by ``rayfed.run_many``. A run-round's
time is the wall time from the end of the last warm-up round to the end of the last timed round (the latest of
the K runs at each end) over K x the timed rounds.

The hours: the column's runnable rows (``rayfed reproduce``'s cells, as ``--plan`` counts them) x the table's
``paper_seeds`` x ``paper_rounds`` x a run-round's seconds / 3600, alone and packed. An estimate: it takes every
row's run-round to cost FedAvg's, and the packed figure takes every row's runs to pack K at a time (a row's 3 seeds
pack with each other, and with rows of the same method that differ in floats only).

    python benchmarks/packed_round.py [--data-root DIR] [--runs 8] [--warmup 2] [--rounds 5] [--quick] [--tiny]
        [--out FILE.json | --record]

``--quick``: 1 warm-up and 2 timed rounds. ``--tiny``: 4 clients of 60 synthetic samples on the CPU, a smoke test
whose seconds mean nothing. Without CUDA and without ``--tiny`` it says so and exits 0. The last line:
``packed_round: device=<name> s_per_run_round_alone=<s> s_per_run_round_packed_k<K>=<s> packed_over_alone=<x>
table_mnist_hours_alone=<h> table_mnist_hours_packed_k<K>=<h>``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import add_output_arguments, output_path, provenance  # noqa: E402
from gpu import mnist_overrides  # noqa: E402

import rayfed  # noqa: E402
from rayfed.config.run_config import RunConfig  # noqa: E402
from rayfed.engine.callbacks import Callback  # noqa: E402
from rayfed.execution.run_packs import pack_runs  # noqa: E402
from rayfed.reproduce import TABLES, Table  # noqa: E402
from rayfed.reproduce.runner import plan  # noqa: E402

TABLE, COLUMN, ROW = "cwfedavg-iccv-t1", "prac_mnist", "fedavg"
"""P-ICCV Table 1, its MNIST column, and the row whose run is timed."""
NO_GPU = "packed_round.py: found no CUDA GPU (torch.cuda.is_available() is False); nothing measured (--tiny: CPU smoke)"
TINY = {"data.dataset": "synthetic", "data.root": None, "data.options": {"num_samples": 240}, "data.num_clients": 4}
"""The CPU smoke test's data: 4 clients of 60 samples."""


class RoundEnds(Callback):
    """The wall-clock time at the end of every round."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def after_round(self, run, record, clients) -> bool:
        self.ends.append(time.perf_counter())
        return False


def column_cells(root: Path, data_root: str | None) -> tuple[Table, list[Any]]:
    """The table and the runnable cells of its MNIST column, one seed each (the rows ``rayfed reproduce`` runs)."""
    table = TABLES[TABLE]
    cells = plan(table, root, rounds=1, seeds=[1], columns=[COLUMN], data_root=data_root)
    return table, [cell for cell in cells if cell.config is not None]


def protocol(data_root: str | None, tiny: bool, rounds: int) -> dict[str, Any]:
    """The overrides that turn the column's FedAvg cell into the timed run: ``gpu.py``'s data (or :data:`TINY`), on
    one GPU (the CPU when tiny) in this process, stacked, no checkpoints."""
    source = mnist_overrides(data_root, rounds)
    data = TINY if tiny else {k: source[k] for k in ("data.dataset", "data.root", "data.options") if k in source}
    return {
        **data,
        "train.rounds": rounds,
        "engine.backend": "local",
        "engine.vectorize": "on",
        "engine.num_gpus_per_worker": 0.0 if tiny else 1.0,
        "engine.checkpoint_every": 0,
        "engine.progress": False,
    }


def s_per_run_round(configs: Sequence[RunConfig], warmup: int) -> float:
    """Train ``configs`` (one alone, or several packed by ``rayfed.run_many``); a run-round's seconds after
    ``warmup`` rounds (module docstring)."""
    timers = [RoundEnds() for _ in configs]
    if len(configs) == 1:
        rayfed.run(configs[0], callbacks=timers)
    else:
        rayfed.run_many(configs, callbacks=[[timer] for timer in timers])
    rounds = configs[0].train.rounds
    if any(len(timer.ends) != rounds for timer in timers):
        raise RuntimeError(f"expected {rounds} round ends a run, got {[len(t.ends) for t in timers]}")
    start = max(timer.ends[warmup - 1] for timer in timers)
    end = max(timer.ends[-1] for timer in timers)
    return (end - start) / (len(configs) * (rounds - warmup))


def horizon_hours(table: Table, rows: int, seconds: float) -> float:
    """A column of ``rows`` rows at the papers' horizon: rows x seeds x rounds x a run-round's seconds, in hours."""
    return rows * table.paper_seeds * table.paper_rounds * seconds / 3600


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Time one run alone and ``args.runs`` packed; the figures and the hours."""
    table, cells = column_cells(root / "plan", args.data_root)
    cell = next(cell for cell in cells if cell.row.key == ROW)
    base = cell.config.override(protocol(args.data_root, args.tiny, args.warmup + args.rounds))
    alone = s_per_run_round([base.override({"run_dir": str(root / "alone")})], args.warmup)
    seeds = [base.override({"seed": k, "run_dir": str(root / f"packed-{k}")}) for k in range(1, args.runs + 1)]
    packs = pack_runs(seeds)
    if packs.packs != (tuple(range(args.runs)),):
        names = [f"seed {config.seed}" for config in seeds]
        raise RuntimeError(f"the {args.runs} runs do not pack into one stack: {packs.line(names)}")
    packed = s_per_run_round(seeds, args.warmup)
    k = args.runs
    return {
        "table": table.name,
        "column": COLUMN,
        "rows": len(cells),
        "paper_seeds": table.paper_seeds,
        "paper_rounds": table.paper_rounds,
        "clients": base.data.num_clients,
        "dataset": base.data.dataset,
        "summary": {
            "s_per_run_round_alone": alone,
            f"s_per_run_round_packed_k{k}": packed,
            "packed_over_alone": packed / alone,
            "table_mnist_hours_alone": horizon_hours(table, len(cells), alone),
            f"table_mnist_hours_packed_k{k}": horizon_hours(table, len(cells), packed),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=None, help="MNIST in torchvision's layout (default: synthetic)")
    parser.add_argument("--runs", type=int, default=8, help="runs (seeds) packed into one stack")
    parser.add_argument("--warmup", type=int, default=2, help="rounds before the timed ones (CUDA graphs captured)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds")
    parser.add_argument("--quick", action="store_true", help="1 warm-up and 2 timed rounds")
    parser.add_argument("--tiny", action="store_true", help="4 clients of synthetic data on the CPU (a smoke test)")
    add_output_arguments(parser, "packed_round.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.warmup, args.rounds = 1, 2
    for name in ("runs", "warmup", "rounds"):
        if getattr(args, name) < (2 if name == "runs" else 1):
            parser.error(f"--{name}={getattr(args, name)} is too small; give at least {2 if name == 'runs' else 1}")
    if not args.tiny and not torch.cuda.is_available():
        print(NO_GPU, flush=True)
        return 0
    device = "cpu" if args.tiny else torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__}, {device}", flush=True)
    with tempfile.TemporaryDirectory(prefix="rayfed-packed-round-") as tmp:
        result = measure(args, Path(tmp))
    k, summary = args.runs, result["summary"]
    print(
        f"{result['table']} {result['column']} FedAvg, {result['clients']} clients ({result['dataset']}), "
        f"{args.warmup} warm-up + {args.rounds} timed rounds: a run-round alone "
        f"{summary['s_per_run_round_alone']:.3f} s, {k} seeds packed {summary[f's_per_run_round_packed_k{k}']:.3f} s",
        flush=True,
    )
    print(
        f"the column at the papers' horizon ({result['rows']} rows x {result['paper_seeds']} seeds x "
        f"{result['paper_rounds']} rounds, every row priced as FedAvg): "
        f"{summary['table_mnist_hours_alone']:,.1f} h alone, {summary[f'table_mnist_hours_packed_k{k}']:,.1f} h "
        f"packed {k} at a time",
        flush=True,
    )
    out = output_path(args, "packed_round.json")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        record = {**provenance(), "device": device, "torch": torch.__version__, **result}
        out.write_text(json.dumps({**record, "args": {name: str(v) for name, v in vars(args).items()}}, indent=2))
    fields = " ".join(f"{key}={value:.4g}" for key, value in summary.items())
    print(f"packed_round: device={device.replace(' ', '_')} {fields}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
