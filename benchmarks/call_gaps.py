"""Where a ClientWorker's round goes: inside its calls, between them, and at the round's serial stretches.

rayfed alone on ``throughput.py``'s S1 or S2 workload (private local Ray, one ClientWorker per core). After the
first round, each worker's ``ClientRunner.train`` and ``.evaluate`` are wrapped in the worker's own process (through
``__ray_call__``) to time-stamp every call; after the last round the stamps are read back. Per worker and round:

* ``train gaps`` / ``eval gaps``: the time between the end of one of its calls and the start of its next in the same
  phase (the worker idles: its next call has not reached it, or Ray is still storing the last one's reply);
* ``train->eval``: from the end of its last training call to the start of its first evaluation call (the other
  worker's last call, the aggregation, the driver's dispatch);
* ``eval->train``: from the end of its last evaluation call to the start of the next round's first training call
  (the driver's round records and metrics files, the next round's split and dispatch).

    python benchmarks/call_gaps.py [--scenario s1] [--rounds 7]

Last line (medians over workers and rounds, milliseconds)::

    train_gaps_ms=<x> eval_gaps_ms=<y> train_to_eval_ms=<z> eval_to_train_ms=<w>
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput  # noqa: E402

from rayfed import run  # noqa: E402
from rayfed.engine import Simulation  # noqa: E402
from rayfed.engine.callbacks import Callback  # noqa: E402

KINDS = ("train", "evaluate")


def _stamp_calls(actor: Any) -> bool:
    """In a ClientWorker's process: wrap its runner's calls to record (kind, start, end) in ``actor.call_stamps``."""
    runner, stamps = actor.runner, []
    actor.call_stamps = stamps
    for kind in KINDS:
        call = getattr(runner, kind)

        def stamped(*args: Any, _call: Any = call, _kind: str = kind, **kwargs: Any) -> Any:
            started = time.time()
            try:
                return _call(*args, **kwargs)
            finally:
                stamps.append((_kind, started, time.time()))

        setattr(runner, kind, stamped)
    return True


def _stamps(actor: Any) -> list[tuple[str, float, float]]:
    return list(actor.call_stamps)


class CallStamps(Callback):
    """Starts stamping the workers' calls after the first round; reads the stamps after the last."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.simulation: Simulation | None = None
        self.round_ends: list[float] = []
        self.stamps: list[list[tuple[str, float, float]]] = []

    def after_round(self, run_view, record, clients) -> bool:
        self.round_ends.append(time.time())
        assert self.simulation is not None and self.simulation.executor is not None
        workers = self.simulation.executor.pool.workers  # type: ignore[attr-defined]
        if record.round == 0:
            ray.get([w.__ray_call__.remote(_stamp_calls) for w in workers])
        if record.round == self.rounds - 1:
            self.stamps = ray.get([w.__ray_call__.remote(_stamps) for w in workers])
        return False


def gaps(stamps: list[tuple[str, float, float]], round_ends: list[float]) -> list[dict[str, float]]:
    """Per round (from the second on) of one worker: its gaps in each phase and at the two boundaries (seconds)."""
    by_round: dict[int, list[tuple[str, float, float]]] = {}
    for kind, start, end in sorted(stamps, key=lambda s: s[1]):
        r = next(i for i, t in enumerate(round_ends) if end <= t + 1e-3)
        by_round.setdefault(r, []).append((kind, start, end))
    rows = []
    for r, calls in sorted(by_round.items()):
        phase = {k: [(s, e) for kind, s, e in calls if kind == k] for k in KINDS}
        row = {f"{k}_gaps": sum(b[0] - a[1] for a, b in zip(v, v[1:])) for k, v in phase.items()}
        if phase["train"] and phase["evaluate"]:
            row["train_to_eval"] = phase["evaluate"][0][0] - phase["train"][-1][1]
        following = [s for kind, s, _ in by_round.get(r + 1, []) if kind == "train"]
        if following and phase["evaluate"]:
            row["eval_to_train"] = min(following) - phase["evaluate"][-1][1]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=sorted(throughput.SCENARIOS), default="s1")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the first is not stamped")
    args = parser.parse_args(argv)
    workload = argparse.Namespace(rounds=args.rounds, workers=0, clients_per_call=0, vectorize="auto")
    probe = CallStamps(args.rounds)
    make = Simulation._make_executor

    def make_and_keep(simulation: Simulation) -> Any:
        probe.simulation = simulation
        return make(simulation)

    Simulation._make_executor = make_and_keep  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory(prefix="rayfed-call-gaps-") as tmp:
        config = throughput.scenario_config(throughput.SCENARIOS[args.scenario], workload, Path(tmp) / "run")
        run(config, callbacks=[probe])
    rows = [row for stamps in probe.stamps for row in gaps(stamps, probe.round_ends)]
    keys = ("train_gaps", "evaluate_gaps", "train_to_eval", "eval_to_train")
    medians = {k: 1e3 * statistics.median(r[k] for r in rows if k in r) for k in keys}
    for worker, stamps in enumerate(probe.stamps):
        for r, row in enumerate(gaps(stamps, probe.round_ends), start=1):
            print(f"worker {worker} round {r}: " + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in row.items()))
    print(
        f"train_gaps_ms={medians['train_gaps']:.1f} eval_gaps_ms={medians['evaluate_gaps']:.1f} "
        f"train_to_eval_ms={medians['train_to_eval']:.1f} eval_to_train_ms={medians['eval_to_train']:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
