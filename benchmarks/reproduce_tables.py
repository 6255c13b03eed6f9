"""Reproduce the papers' tables on MNIST and the offline dataset, as far as the machine allows.

    python benchmarks/reproduce_tables.py --data-root ~/data --rounds 20          # cwFedAvg, 3 seeds
    python benchmarks/reproduce_tables.py --data-root ~/data --rounds 20 --methods dist,no_wdr,wdr_all --seeds 0
    python benchmarks/reproduce_tables.py --table fedawa --data-root ~/data --rounds 20 --seeds 0

``--table cwfedavg`` (default): MNIST, 20 clients, pathological (2 classes per client) and
practical (Dirichlet α = 0.1) partitions with partition seed 1, the papers' 4-layer CNN,
SGD lr 0.005, batch 10, one local epoch, join ratio 1, λ = 10 (docs/algorithms.md, cwFedAvg and "Data and evaluation"
sections). Methods:

=========  =========================================================================
fedavg     FedAvg
cwfedavg   cwFedAvg (Output): output layer class-wise, p̃ + WDR (P-ICCV's headline)
dist       cwFedAvg w/ Dist.: all layers, the true p_i, no WDR (P-arXiv)
no_wdr     cwFedAvg w/o WDR: all layers, p̃ without the regulariser (P-arXiv)
wdr_all    cwFedAvg w/ WDR: all layers, p̃ + WDR (P-arXiv)
=========  =========================================================================

``--table fedawa``: FedAWA against FedAvg (issue: MNIST Dirichlet α = 0.1 and 0.5, and the
offline dataset), with the clients of P-AWA (App. A.5; docs/algorithms.md, FedAWA section: SGD momentum 0.9 kept across
rounds, weight decay 5e-4, one epoch, 70/30 train/test per client, all 20 clients every
round) and the 4-layer CNN; lr 0.01 and batch 50 (the paper's 0.08 and 128 are for
ResNet-20 on CIFAR). FedAvg gets the same clients. Methods ``fedavg_m``, ``fedawa_code``,
``fedawa_paper1`` and ``fedawa_paper5`` (fidelity=paper with 1 and 5 Adam steps per round),
``fedawa_l_code``, ``fedawa_l_paper1``. The paper's numbers are for CIFAR and Tiny
ImageNet, so the table has none beside ours.

Every (partition, method, seed) runs through :func:`rayfed.run` into
``OUT/runs/<partition>-<method>-s<seed>``; the score is the best pooled accuracy over the
first R rounds (the papers' metric, max over rounds). The script is incremental: a run
that already has R rounds is skipped, a shorter finished one is extended to R rounds and a
killed one resumes from its last checkpoint, so it can be run again and again as time
allows. After every run it rewrites the table (``OUT/reproduce_tables.md`` and ``.json``
for cwFedAvg, ``OUT/fedawa_accuracy.md`` and ``.json`` for FedAWA: method × partition,
ours as mean ± std over the seeds finished, beside the papers' numbers where they exist);
at the end it draws the figures (``rayfed.plots``) into ``OUT/figures``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import private_ray  # noqa: E402  (sibling module of the benchmark scripts)

import rayfed  # noqa: E402
from rayfed.checkpoint import newest_checkpoint  # noqa: E402
from rayfed.errors import CheckpointError, CheckpointFormatError  # noqa: E402
from rayfed.io import atomic_write, write_json  # noqa: E402


@dataclass(frozen=True)
class Method:
    label: str
    overrides: dict[str, Any]


@dataclass(frozen=True)
class Table:
    """One comparison: its methods, partitions, shared settings, the papers' numbers and its caption."""

    title: str
    output: str
    """Stem of the table files under OUT (``.md``, ``.json``)."""
    methods: dict[str, Method]
    partitions: dict[str, tuple[str, dict[str, Any]]]
    common: dict[str, Any]
    caption: str
    """Formatted with ``rounds``."""
    paper: dict[tuple[str, str], str]


_ENGINE: dict[str, Any] = {
    "engine.join_ratio": 1.0,
    "engine.eval_every": 1,
    "engine.checkpoint_every": 1,
    "engine.progress": False,
}
_CW = {"algorithm.name": "cwfedavg", "algorithm.params.wdr_lambda": 10.0, "algorithm.params.fidelity": "code"}
PAPER_ROUNDS = 1000
CWFEDAVG = Table(
    title="cwFedAvg on MNIST: this engine against the papers",
    output="reproduce_tables",
    methods={
        "fedavg": Method("FedAvg", {"algorithm.name": "fedavg"}),
        "cwfedavg": Method("cwFedAvg (Output)",
                           {**_CW, "algorithm.params.variant": "wdr", "algorithm.params.classwise_blocks": 1}),
        "dist": Method("cwFedAvg w/ Dist. (all layers)",
                       {**_CW, "algorithm.params.variant": "dist", "algorithm.params.classwise_blocks": 0}),
        "no_wdr": Method("cwFedAvg w/o WDR (all layers)",
                         {**_CW, "algorithm.params.variant": "no_wdr", "algorithm.params.classwise_blocks": 0}),
        "wdr_all": Method("cwFedAvg w/ WDR (all layers)",
                          {**_CW, "algorithm.params.variant": "wdr", "algorithm.params.classwise_blocks": 0}),
    },
    partitions={
        "path": ("Path MNIST", {"data.partition": "pathological", "data.classes_per_client": 2}),
        "prac": ("Prac MNIST", {"data.partition": "dirichlet", "data.alpha": 0.1}),
    },
    common={
        "data.dataset": "mnist",
        "data.num_clients": 20,
        "data.seed": 1,
        "model.name": "cnn4",
        "train.lr": 0.005,
        "train.batch_size": 10,
        "train.local_epochs": 1,
        **_ENGINE,
    },
    caption=(
        "Ours: best pooled test accuracy (%) over the first {rounds} rounds (max over rounds, as the papers), "
        "mean ± std over model seeds (np.std, as PFLlib), 20 clients, cnn4, SGD lr 0.005, batch 10, 1 local "
        "epoch, λ = 10 (0.5·λ in the loss, as the authors' code), join ratio 1, partition seed 1. "
        f"Papers: {PAPER_ROUNDS} rounds, 3 seeds; [A] = P-arXiv Tab. 1 (all layers class-wise), "
        "[I] = P-ICCV Tab. 1 (docs/algorithms.md, papers' numbers section); – = not reported."
    ),
    paper={  # P-ICCV Tab. 1 and P-arXiv Tab. 1 (docs/algorithms.md, "Papers' numbers"), 1000 rounds
        ("fedavg", "path"): "98.08 [A]",
        ("dist", "path"): "99.86 [A]",
        ("no_wdr", "path"): "97.94 [A]",
        ("wdr_all", "path"): "99.87 [A]",
        ("fedavg", "prac"): "98.70 ± 0.04 [I], 98.70 [A]",
        ("cwfedavg", "prac"): "99.52 ± 0.03 [I]",
        ("dist", "prac"): "99.52 [A]",
        ("no_wdr", "prac"): "98.71 [A]",
        ("wdr_all", "prac"): "99.47 [A]",
    },
)


def _awa(name: str, fidelity: str, steps: int = 1) -> dict[str, Any]:
    return {"algorithm.name": name, "algorithm.params": {"fidelity": fidelity, "server_steps": steps}}


FEDAWA = Table(
    title="FedAWA against FedAvg on MNIST and the offline dataset",
    output="fedawa_accuracy",
    methods={
        "fedavg_m": Method("FedAvg", {"algorithm.name": "fedavg", "algorithm.client": "sgdm"}),
        "fedawa_code": Method("FedAWA, fidelity=code", _awa("fedawa", "code")),
        "fedawa_paper1": Method("FedAWA, fidelity=paper, 1 step", _awa("fedawa", "paper")),
        "fedawa_paper5": Method("FedAWA, fidelity=paper, 5 steps", _awa("fedawa", "paper", 5)),
        "fedawa_l_code": Method("FedAWA-L, fidelity=code", _awa("fedawa_l", "code")),
        "fedawa_l_paper1": Method("FedAWA-L, fidelity=paper, 1 step", _awa("fedawa_l", "paper")),
    },
    partitions={
        "mnist01": ("MNIST α=0.1", {"data.dataset": "mnist", "data.partition": "dirichlet", "data.alpha": 0.1}),
        "mnist05": ("MNIST α=0.5", {"data.dataset": "mnist", "data.partition": "dirichlet", "data.alpha": 0.5}),
        "offline": ("offline α=0.1", {"data.dataset": "synthetic", "data.partition": "dirichlet", "data.alpha": 0.1}),
    },
    common={
        "data.num_clients": 20,
        "data.seed": 1,
        "data.train_fraction": 0.7,
        "model.name": "cnn4",
        "train.lr": 0.01,
        "train.momentum": 0.9,
        "train.weight_decay": 5e-4,
        "train.batch_size": 50,
        "train.local_epochs": 1,
        **_ENGINE,
    },
    caption=(
        "Ours: best pooled test accuracy (%) of the global model over the first {rounds} rounds, mean ± std over "
        "model seeds, 20 clients, cnn4, SGD lr 0.01 with momentum 0.9 kept across rounds and weight decay 5e-4, "
        "batch 50, 1 local epoch, 70/30 train/test per client, join ratio 1, partition seed 1. FedAvg uses the same "
        "clients (algorithm.client=sgdm). P-AWA reports CIFAR-10/100 and Tiny ImageNet only (docs/algorithms.md, "
        "papers' numbers section), so there is no paper column here."
    ),
    paper={},
)
TABLES = {"cwfedavg": CWFEDAVG, "fedawa": FEDAWA}


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _seeds(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", choices=tuple(TABLES), default="cwfedavg",
                        help="which comparison (default cwfedavg)")
    parser.add_argument("--rounds", type=int, default=20, help="rounds per run (papers: 1000; default 20)")
    parser.add_argument("--seeds", type=_seeds, default=[0, 1, 2], help="model seeds, e.g. 0,1,2 (default)")
    parser.add_argument("--methods", type=_names, default=None, help="comma-separated, from the table's (default: all)")
    parser.add_argument("--partitions", type=_names, default=None,
                        help="comma-separated, from the table's (default: all)")
    parser.add_argument("--workers", type=int, default=2, help="ClientWorker actors (default 2)")
    parser.add_argument("--local", action="store_true", help="engine.backend=local (one process, no Ray)")
    parser.add_argument("--data-root", default=os.environ.get("RAYFED_DATA", "data"),
                        help="folder with MNIST/raw/*.gz, writable (default $RAYFED_DATA or ./data)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="default benchmarks/results")
    parser.add_argument("--no-figures", action="store_true", help="do not draw figures at the end")
    parser.add_argument("--table-only", action="store_true", help="only rewrite the table from the runs there")
    args = parser.parse_args(argv)
    table = TABLES[args.table]
    for option, known in (("methods", table.methods), ("partitions", table.partitions)):
        chosen = getattr(args, option) or list(known)
        unknown = [n for n in chosen if n not in known]
        if unknown:
            parser.error(f"--{option}: unknown {unknown} for --table {args.table}; choose from {', '.join(known)}")
        setattr(args, option, chosen)
    return args


# --- runs ---------------------------------------------------------------------------------------


def run_dir(out: Path, partition: str, method: str, seed: int) -> Path:
    return out / "runs" / f"{partition}-{method}-s{seed}"


def rounds_done(directory: Path) -> int:
    """Rounds of a finished run (summary.json), else 0."""
    summary = directory / "summary.json"
    return int(json.loads(summary.read_text())["rounds_run"]) if summary.is_file() else 0


def run_one(args: argparse.Namespace, partition: str, method: str, seed: int) -> str:
    """Run (or extend, or resume) one config to ``args.rounds`` rounds; returns what was done."""
    table = TABLES[args.table]
    directory = run_dir(args.out, partition, method, seed)
    done = rounds_done(directory)
    if done >= args.rounds:
        return f"skipped (has {done} rounds)"
    overrides = {
        **table.common, **table.partitions[partition][1], **table.methods[method].overrides,
        "data.root": str(Path(args.data_root).expanduser()), "seed": seed, "train.rounds": args.rounds,
        "engine.backend": "local" if args.local else "ray", "engine.num_workers": args.workers,
        "run_dir": str(directory),
    }
    config = rayfed.RunConfig().override(overrides)
    resume = (directory / "config.json").is_file()
    if resume and newest_checkpoint(directory) is None:
        shutil.rmtree(directory)  # killed before its first checkpoint: nothing to keep
        resume = False
    try:
        result = rayfed.run(config, resume=resume)
    except CheckpointFormatError:  # written by another rayfed version: keep it, let the user decide
        raise
    except CheckpointError:  # a checkpoint torn by a kill: start this run again
        shutil.rmtree(directory)
        result = rayfed.run(config)
    what = "extended" if done else ("resumed" if resume else "ran")
    return f"{what} to {result.rounds_run} rounds, best {100 * result.best_accuracy:.2f}"


# --- the table ----------------------------------------------------------------------------------


def score(directory: Path, rounds: int) -> dict[str, Any] | None:
    """Best pooled accuracy (%) over the first ``rounds`` rounds of a run that has them, else None."""
    if rounds_done(directory) < rounds:
        return None
    rows = [r for r in pq.read_table(directory / "rounds.parquet").to_pylist() if r["round"] < rounds]
    accuracies = [r["accuracy"] for r in rows if not math.isnan(r["accuracy"])]
    best = int(np.argmax(accuracies))
    return {"best": 100 * accuracies[best], "best_round": best + 1, "final": 100 * accuracies[-1],
            "seconds_per_round": float(np.median([r["round_s"] for r in rows]))}


def runs_of(table: Table, out: Path, partition: str = "*") -> list[tuple[Path, re.Match[str]]]:
    """The run directories of ``table`` under ``out/runs`` (of one partition, or all), with
    their parsed names (groups ``partition``, ``method``, ``seed``); see :func:`run_dir`."""
    found = []
    for directory in sorted((out / "runs").glob(f"{partition}-*-s*")):
        name = re.fullmatch(r"(?P<partition>\w+)-(?P<method>\w+)-s(?P<seed>\d+)", directory.name)
        if name and name["method"] in table.methods and name["partition"] in table.partitions:
            found.append((directory, name))
    return found


def collect(table: Table, out: Path, rounds: int) -> dict[str, dict[str, dict[int, dict[str, Any]]]]:
    """method -> partition -> seed -> score, for every finished run of ``table`` under ``out/runs``."""
    results: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for directory, name in runs_of(table, out):
        found = score(directory, rounds)
        if found is not None:
            results.setdefault(name["method"], {}).setdefault(name["partition"], {})[int(name["seed"])] = found
    return results


def _cell(scores: dict[int, dict[str, Any]] | None, rounds: int) -> str:
    if not scores:
        return "not run"
    best = np.array([s["best"] for s in scores.values()])
    if len(best) == 1:
        return f"{best[0]:.2f} (1 seed, {rounds} rounds)"
    return f"{best.mean():.2f} ± {best.std():.2f} ({len(best)} seeds, {rounds} rounds)"


def write_table(table: Table, out: Path, rounds: int, command: str) -> Path:
    results = collect(table, out, rounds)
    header = [f"{table.partitions[p][0]}: {kind}" for p in table.partitions for kind in ("ours", "paper")
              if kind == "ours" or table.paper]
    lines = [f"# {table.title}", "", table.caption.format(rounds=rounds), "",
             "| method | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
    for method, spec in table.methods.items():
        cells = []
        for partition in table.partitions:
            cells.append(_cell(results.get(method, {}).get(partition), rounds))
            if table.paper:
                cells.append(table.paper.get((method, partition), "–"))
        lines.append(f"| {spec.label} | " + " | ".join(cells) + " |")
    lines += ["", "Per run (best round: where the best accuracy was reached; s/round: median wall time):", "",
              "| partition | method | seed | best | best round | final | s/round |", "|---|---|---|---|---|---|---|"]
    for partition in table.partitions:
        for method in table.methods:
            for seed, s in sorted(results.get(method, {}).get(partition, {}).items()):
                lines.append(f"| {partition} | {method} | {seed} | {s['best']:.2f} | {s['best_round']} | "
                             f"{s['final']:.2f} | {s['seconds_per_round']:.1f} |")
    lines += ["", f"Written by `{command}`; the table includes every run under {out / 'runs'} with {rounds}+ rounds, "
              "also those of earlier calls.", ""]
    path = out / f"{table.output}.md"
    atomic_write(path, lambda tmp: Path(tmp).write_text("\n".join(lines)))
    write_json(out / f"{table.output}.json", {"rounds": rounds, "results": results})
    return path


def draw_figures(table: Table, out: Path, rounds: int) -> list[Path]:
    """Accuracy curves per partition (all methods and seeds) and p/p̃ and row-norm figures of each cwFedAvg run."""
    from rayfed.plots import load_run, plot_accuracy_curves, plot_run_figures

    figures = out / "figures"
    paths = []
    for partition in table.partitions:
        dirs = [d for d, _ in runs_of(table, out, partition) if rounds_done(d) >= rounds]
        if dirs:
            runs = [load_run(d) for d in dirs]
            for run in runs:  # the curves show the rounds the table scores
                run.rounds = [r for r in run.rounds if r["round"] < rounds]
            paths.append(plot_accuracy_curves(runs, figures / f"accuracy-{partition}.png"))
            for run in runs:
                if run.is_cwfedavg and run.name.endswith("-s0"):
                    paths += plot_run_figures(run, figures)
    return paths


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    table = TABLES[args.table]
    command = shlex.join([Path(sys.executable).name, *sys.argv]) if argv is None else shlex.join(argv)
    configs = [(p, m, s) for s in args.seeds for m in args.methods for p in args.partitions]
    if not args.table_only:
        start = time.perf_counter()
        with private_ray(args.workers) if not args.local else contextlib.nullcontext():
            for n, (partition, method, seed) in enumerate(configs, 1):
                t, name = time.perf_counter(), f"[{n}/{len(configs)}] {partition} {method} seed {seed}"
                print(f"{name} ...", flush=True)
                what = run_one(args, partition, method, seed)
                print(f"{name}: {what} in {time.perf_counter() - t:.0f} s (total {time.perf_counter() - start:.0f} s)",
                      flush=True)
                write_table(table, args.out, args.rounds, command)
    path = write_table(table, args.out, args.rounds, command)
    print(path.read_text())
    if not args.no_figures:
        for figure in draw_figures(table, args.out, args.rounds):
            print(figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
