"""A device model and an availability model of your own, registered from this script like a method (docs/system.md,
"Devices and availability of your own").

* ``phone_classes``: each client's device is drawn from a small catalogue of phone classes (a flagship, a mid-range
  and an old phone, one in five, three in five and one in five of the clients), each with its speed and its links;
* ``regional_outages``: the clients live in regions of ten, and each region loses its network for ``--outage-s``
  seconds of every ``--period-s``, from a moment drawn per region: a correlated outage, which no per-client draw
  gives (a period of a day and an outage of hours are the realistic scale; the defaults show it in a short run).

Both are functions of ``system.seed`` and the number of clients, so the run is seeded like every other; the script
runs FedAvg on them with a deadline and prints, round by round, how many clients were online when the round sampled,
how many it kept, how many went offline before they finished, and its virtual time. The models travel to Ray's
workers as a method registered in a script does (``engine.backend=ray``), and the run's marker seals this file.

    python examples/system_own_models.py [--rounds 6] [--out runs/own_models] [field.path=value ...]
"""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow.parquet as pq

from rayfed import RunConfig, run
from rayfed.config import parse_override
from rayfed.system import Availability, register_availability, register_devices

PHONES = {  # class: (share of the clients, slowdown, download Mbit/s, upload Mbit/s)
    "flagship": (0.2, 0.5, 50.0, 20.0),
    "mid-range": (0.6, 1.0, 20.0, 5.0),
    "old": (0.2, 3.0, 5.0, 1.0),
}
REGION = 10
"""Clients per region."""


@register_devices("phone_classes")
def phone_classes(seed: int, num_clients: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each client's phone class, drawn with the catalogue's shares: its slowdown and its bandwidths."""
    shares, slowdown, down, up = (np.array(column) for column in zip(*PHONES.values()))
    drawn = np.random.default_rng(seed).choice(len(PHONES), size=num_clients, p=shares)
    return slowdown[drawn], down[drawn], up[drawn]


def register_outages(outage_s: float, period_s: float) -> None:
    """Register ``regional_outages``: each region of :data:`REGION` clients offline ``outage_s`` seconds of every
    ``period_s``, from a moment drawn per region (its window online is the rest of the period)."""

    @register_availability("regional_outages")
    def regional_outages(seed: int, num_clients: int) -> Availability:
        regions = np.arange(num_clients) // REGION
        back = np.random.default_rng(seed).uniform(0.0, period_s, size=regions.max() + 1)[regions]
        down = back + period_s - outage_s  # online from the end of its outage for the rest of the period
        clients = np.concatenate([np.arange(num_clients)] * 2)  # a window across the period's end is two
        starts = np.concatenate([back, np.zeros(num_clients)])
        ends = np.concatenate([np.minimum(down, period_s), np.clip(down - period_s, 0.0, None)])
        periods = np.full(num_clients, period_s)
        return Availability.from_windows(clients, starts, ends, periods, num_clients, "regional_outages")


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="FedAvg on a device and an availability model of your own")
    parser.add_argument("--out", default="runs/own_models", help="the run directory")
    parser.add_argument("--clients", type=int, default=40, help="data.num_clients")
    parser.add_argument("--rounds", type=int, default=6, help="train.rounds")
    parser.add_argument("--outage-s", type=float, default=20.0, help="seconds of each period a region is offline")
    parser.add_argument("--period-s", type=float, default=60.0, help="the period of the regions' outages")
    parser.add_argument("overrides", nargs="*", metavar="field.path=value")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    register_outages(args.outage_s, args.period_s)
    config = RunConfig().override(
        {
            "data.dataset": "synthetic",
            "data.options": {"num_samples": 3000},
            "data.num_clients": args.clients,
            "data.partition": "iid",
            "train.rounds": args.rounds,
            "engine.backend": "local",
            "engine.progress": False,
            "engine.join_ratio": 0.25,
            "system.devices": "phone_classes",
            "system.availability": "regional_outages",
            "system.step_s": 0.05,
            "system.deadline_s": 6.0,
            "system.over_commit": 1.3,
            "run_dir": args.out,
            **dict(parse_override(text) for text in args.overrides),
        }
    )
    result = run(config)
    print(f"{'round':>5} {'online':>6} {'kept':>4} {'offline':>7} {'virtual s':>9}")
    for row in pq.read_table(f"{result.run_dir}/rounds.parquet").to_pylist():
        online, kept, lost = (int(row[f"clients_{k}"]) for k in ("online", "finished", "offline"))
        print(f"{row['round'] + 1:>5} {online:>6} {kept:>4} {lost:>7} {row['virtual_time_s']:>9.1f}")
    devices = pq.read_table(f"{result.run_dir}/devices.parquet").to_pydict()
    print(f"phone classes drawn (slowdown: clients): {dict(zip(*np.unique(devices['slowdown'], return_counts=True)))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
