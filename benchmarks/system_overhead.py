"""What the system model adds to a round's wall time, on the throughput benchmark's scenario (docs/system.md).

The scenario is ``throughput.py``'s (FedAvg, cnn4, 1x28x28 synthetic images, 50 training and 10 test samples per
client, batch 10, one local epoch, on a private local Ray with one ClientWorker per core): S2 by default, 1,000
clients of which 100 train each round. It runs alternately without a system model and with one
(``system.devices=lognormal``: every client a device, the rounds on the virtual clock, each client's status and
``virtual_time_s`` recorded), ``--repeats`` times each, in one Ray, so that a drift in the shared machine's speed
weighs on both alike; which of a pair runs first alternates, as the second run of a pair starts while Ray still
tears the first one's actors down. Without a deadline every device is online, so both train the same clients with
the same numbers: the difference is the system model's own work.

Two measures, each a ratio taken within the same runs:

* ``wall_ratio``: the median round's wall time with the system model over without (median over the repeats'
  ratios of each pair of runs, each run's median after its warm-up round);
* ``system_share``: the seconds the round loop spends in the system model's calls
  (:meth:`~rayfed.scheduling.sync_rounds.Rounds.context` and :meth:`~rayfed.scheduling.sync_rounds.Rounds.settle`)
  over the round's wall time, here also with a deadline and over-commitment (``--deadline``), whose rounds train
  other clients.

The last line: ``wall_ratio=<x> system_share=<y> system_share_deadline=<z>``. Run (alone: it times)::

    python benchmarks/system_overhead.py [--scenario s2] [--rounds 6] [--repeats 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RoundTimer, median_after_warmup, private_ray  # noqa: E402
from throughput import SCENARIOS, scenario_config  # noqa: E402

from rayfed import run  # noqa: E402
from rayfed.scheduling.sync_rounds import Rounds, VirtualRounds  # noqa: E402

SYSTEM = {"system.devices": "lognormal", "system.step_s": 0.05}


class SystemClock:
    """Seconds spent in the rounds' ``context`` and ``settle`` calls (the system model's, or the plain sample's)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        return call


def timed_run(config: Any) -> tuple[float, float]:
    """(median round seconds after the warm-up round, seconds per round in the rounds' calls)."""
    clock, timer = SystemClock(), RoundTimer()
    kept = {cls: (cls.context, cls.settle) for cls in (Rounds, VirtualRounds)}
    for cls, (context, settle) in kept.items():
        cls.context, cls.settle = clock.timed(context), clock.timed(settle)  # type: ignore[method-assign]
    try:
        run(config, callbacks=[timer])
    finally:
        for cls, (context, settle) in kept.items():
            cls.context, cls.settle = context, settle  # type: ignore[method-assign]
    return median_after_warmup(timer.seconds), clock.seconds / len(timer.seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="s2")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per run; the first is warm-up")
    parser.add_argument(
        "--repeats", type=int, default=4, help="pairs of runs without and with the system model, in turn either order"
    )
    parser.add_argument("--deadline", type=float, default=6.0, help="system.deadline_s of the deadline run")
    parser.add_argument("--workers", type=int, default=0, help="ClientWorker actors (0 = one per CPU)")
    args = parser.parse_args(argv)
    args.clients_per_call, args.vectorize = 0, "auto"  # throughput.py's defaults
    scenario = SCENARIOS[args.scenario]
    ratios, shares = [], []
    with tempfile.TemporaryDirectory(prefix="rayfed-system-") as tmp, private_ray():
        base = scenario_config(scenario, args, Path(tmp) / "run")
        for repeat in range(args.repeats):  # the order alternates: a run after another pays for its teardown
            first_on = repeat % 2 == 1
            if first_on:
                on, share = timed_run(base.override({**SYSTEM, "run_dir": f"{tmp}/on{repeat}"}))
            off, _ = timed_run(base.override({"run_dir": f"{tmp}/off{repeat}"}))
            if not first_on:
                on, share = timed_run(base.override({**SYSTEM, "run_dir": f"{tmp}/on{repeat}"}))
            ratios.append(on / off)
            shares.append(share / on)
            print(f"repeat {repeat}: {off:.3f} s/round without, {on:.3f} s with ({on / off:.3f}x)", flush=True)
        deadline = {**SYSTEM, "system.deadline_s": args.deadline, "system.over_commit": 1.3}
        round_s, share = timed_run(base.override({**deadline, "run_dir": f"{tmp}/deadline"}))
    print(
        f"wall_ratio={statistics.median(ratios):.4f} system_share={statistics.median(shares):.5f} "
        f"system_share_deadline={share / round_s:.5f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
