"""Server memory and seconds per round of cwFedAvg (Output) as the client population grows.

Populations of 100; 1,000; 10,000; 100,000 and 1,000,000 clients, 100 of them sampled per
round, on the offline synthetic dataset (1x28x28, 15 samples per client, split 10 train /
5 test so that every client takes one SGD step of batch 10), the 4-layer CNN, WDR with
λ = 10. Up to 100,000 clients the dataset has 15 samples per client, dealt IID
(``data.partition="iid"``); larger populations take 15-sample slices of a shared pool of
``--pool`` samples (``data.partition="slices"``, :mod:`rayfed.data.pool_slices`), so
clients overlap in it. Each round trains the sampled clients, aggregates and evaluates
the *sampled* clients (``engine.eval_clients="sampled"``): evaluating all personalised
models every round would dominate the round and measure evaluation, not the engine.

What the server keeps in cwFedAvg (Output) is K heads, the shared layers and two M x K
tables (p̃ and the row norms), so its memory should grow by 80 bytes per client (M x K
float32 twice, K = 10) and the round time should not grow with M. Measured per population:

* ``server_peak_mb``: peak resident memory of the ``ServerActor`` process (``ru_maxrss``),
  ``server_start_mb`` its resident memory right after it was created and
  ``server_state_mb`` the bytes of its state arrays;
* ``round_s``: median wall-clock seconds per round after the first (warm-up) round;
* ``driver_peak_mb``: peak resident memory of the driver process over this population
  (``VmHWM``, reset before each population through ``/proc/self/clear_refs``, once the
  previous population's simulation is collected); it counts the dataset twice with Ray,
  as the driver maps the object store's copy;
* ``setup_s``: generating the dataset, partitioning and building the model (driver).

``--system`` runs every population with the system model (each client a lognormal device and a daily window
online, 12 hours around 22:00; docs/system.md): what its profiles and virtual clock cost in memory and time.

With ``--record`` it writes ``scaling.parquet``, ``scaling.png`` and ``scaling.json`` (the commit measured) to
benchmarks/results, with ``--out DIR`` to DIR, and otherwise nothing. The last line is
``server_mem_mb_100k=<peak MB> round_s_100k=<seconds>`` for the largest population up to 100,000 clients,
followed by ``server_mem_mb_1m=<peak MB> driver_mem_mb_1m=<peak MB> round_s_1m=<seconds>`` for the largest one
above.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    RESULTS,
    RoundTimer,
    add_output_arguments,
    median_after_warmup,
    private_ray,
    provenance,
)

from rayfed import RunConfig, Simulation  # noqa: E402

SAMPLES_PER_CLIENT = 15
TRAIN_PER_CLIENT = 10
SAMPLED_PER_ROUND = 100
LARGEST_DEALT = 100_000
"""Populations up to this size get their own 15 samples per client; larger ones share the pool."""
MB = 2**20
SYSTEM = {"system.devices": "lognormal", "system.availability": "diurnal", "system.online_hours": 12.0}
"""``--system``: every client a device and a daily window online (docs/system.md), the rounds on the virtual clock."""


def rss_bytes(pid: int | str, field: str = "VmRSS") -> int:
    """Resident memory (``VmRSS``) or its peak (``VmHWM``) of a process (Linux ``/proc``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for process {pid}")


def reset_peak_rss() -> None:
    """Start this process's ``VmHWM`` again from its current resident memory (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


class ServerMemory(RoundTimer):
    """Round times, plus the ServerActor's resident memory at the start and its peak at the end (of the
    run of ``simulation``, whose executor it reads)."""

    simulation: Simulation

    def on_run_start(self, run) -> None:
        import ray

        pid = ray.get(self.simulation.executor.server.pid.remote())
        self.start_bytes = rss_bytes(pid)
        super().on_run_start(run)

    def on_run_end(self, run, result) -> None:
        import ray

        server = self.simulation.executor.server
        self.peak_bytes = ray.get(server.peak_rss_bytes.remote())
        self.state_bytes = ray.get(server.memory_bytes.remote())


def population_data(clients: int, pool: int) -> dict[str, object]:
    """IID over 15 samples per client up to :data:`LARGEST_DEALT` clients, else 15-sample slices of the pool."""
    if clients <= LARGEST_DEALT:
        return {"data.options": {"num_samples": SAMPLES_PER_CLIENT * clients}, "data.partition": "iid"}
    return {
        "data.options": {"num_samples": pool},
        "data.partition": "slices",
        "data.samples_per_client": SAMPLES_PER_CLIENT,
    }


def population_config(clients: int, args: argparse.Namespace, run_dir: Path) -> RunConfig:
    return RunConfig().override(
        {
            "algorithm.name": "cwfedavg",
            "algorithm.params.wdr_lambda": 10.0,
            "algorithm.params.classwise_blocks": 1,  # cwFedAvg (Output)
            "data.dataset": "synthetic",
            **population_data(clients, args.pool),
            "data.num_clients": clients,
            "data.train_fraction": TRAIN_PER_CLIENT / SAMPLES_PER_CLIENT,
            "model.name": "cnn4",
            "train.rounds": args.rounds,
            "engine.backend": "ray",
            "engine.num_workers": args.workers,
            "engine.join_ratio": min(1.0, SAMPLED_PER_ROUND / clients),
            "engine.eval_clients": "sampled",
            "engine.checkpoint_every": 0,
            "engine.progress": False,
            "run_dir": str(run_dir),
            **(SYSTEM if args.system else {}),
        }
    )


def measure(clients: int, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    probe = ServerMemory()
    gc.collect()  # the previous population's simulation is a reference cycle (its callbacks see it): free it first
    reset_peak_rss()
    started = time.perf_counter()
    sim = probe.simulation = Simulation(population_config(clients, args, tmp / f"m{clients}"), callbacks=[probe])
    setup_s = time.perf_counter() - started
    result = sim.run()
    return {
        "clients": clients,
        "partition": sim.config.data.partition,
        "pool_samples": len(sim.dataset.labels),
        "sampled_per_round": int(result.history[0]["num_sampled"]),
        "rounds": result.rounds_run,
        "round_s": median_after_warmup(probe.seconds),
        "round_s_max": max(probe.seconds[1:] or probe.seconds),
        "server_start_mb": probe.start_bytes / MB,
        "server_peak_mb": probe.peak_bytes / MB,
        "server_state_mb": probe.state_bytes / MB,
        "driver_peak_mb": rss_bytes("self", "VmHWM") / MB,
        "setup_s": setup_s,
        "accuracy": result.final_accuracy,
    }


def plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = [r["clients"] for r in rows]
    fig, (mem, sec) = plt.subplots(1, 2, figsize=(10, 4))
    mem.plot(clients, [r["server_peak_mb"] for r in rows], "o-", label="ServerActor peak RSS")
    mem.plot(clients, [r["server_start_mb"] for r in rows], "s--", label="ServerActor RSS at start")
    mem.plot(clients, [r["server_state_mb"] for r in rows], "^:", label="server state arrays")
    mem.plot(clients, [r["driver_peak_mb"] for r in rows], "d-.", label="driver peak RSS")
    mem.axhline(2048, color="grey", lw=0.8, ls="--", label="2 GB server budget")
    mem.axhline(4096, color="black", lw=0.8, ls="--", label="4 GB driver budget")
    mem.set(
        xscale="log",
        yscale="log",
        xlabel="clients (population)",
        ylabel="MB",
        title="cwFedAvg (Output): server and driver memory",
    )
    mem.legend(fontsize=8)
    sec.plot(clients, [r["round_s"] for r in rows], "o-")
    for r in rows:
        if r["partition"] == "slices":
            sec.annotate(
                f"slices of {r['pool_samples']:,}",
                (r["clients"], r["round_s"]),
                fontsize=8,
                textcoords="offset points",
                xytext=(-60, 8),
            )
    sec.set(
        xscale="log",
        xlabel="clients (population)",
        ylabel="seconds per round (median)",
        title=f"{SAMPLED_PER_ROUND} clients sampled per round",
    )
    sec.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--populations", default="100,1000,10000,100000,1000000", help="comma-separated client counts")
    parser.add_argument(
        "--pool",
        type=int,
        default=150_000,
        help=f"samples in the pool shared by populations above {LARGEST_DEALT:,} clients",
    )
    parser.add_argument("--rounds", type=int, default=6, help="rounds per population; the first is warm-up")
    parser.add_argument("--workers", type=int, default=0, help="ClientWorker actors (0 = one per CPU)")
    add_output_arguments(parser, "scaling.parquet, scaling.png and scaling.json")
    parser.add_argument(
        "--system", action="store_true", help="with the system model: devices, availability, virtual time"
    )
    args = parser.parse_args(argv)
    populations = [int(p) for p in args.populations.split(",") if p.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rayfed-scaling-") as tmp, private_ray():
        for clients in populations:
            row = measure(clients, args, Path(tmp))
            rows.append(row)
            print(
                f"{clients:>7} clients: {row['round_s']:.3f} s/round (max {row['round_s_max']:.3f}), "
                f"server peak {row['server_peak_mb']:.0f} MB (start {row['server_start_mb']:.0f} MB, "
                f"state {row['server_state_mb']:.1f} MB), driver peak {row['driver_peak_mb']:.0f} MB, "
                f"setup {row['setup_s']:.1f} s, {row['partition']} over {row['pool_samples']} samples, "
                f"accuracy {row['accuracy']:.3f}",
                flush=True,
            )
    out = RESULTS if args.record else args.out
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), out / "scaling.parquet")
        plot(rows, out / "scaling.png")
        arguments = {k: str(v) for k, v in vars(args).items()}
        (out / "scaling.json").write_text(json.dumps({**provenance(), "args": arguments}, indent=2))
        print(f"wrote scaling.parquet, scaling.png and scaling.json (the commit measured) in {out}")
    print(" ".join(last_line_fields(rows)))
    return 0


def population_label(clients: int) -> str:
    """1000000 -> "1m", 100000 -> "100k", 150 -> "150"."""
    for unit, suffix in ((1_000_000, "m"), (1000, "k")):
        if clients % unit == 0:
            return f"{clients // unit}{suffix}"
    return str(clients)


def last_line_fields(rows: list[dict[str, float]]) -> list[str]:
    """Server memory and round time of the largest dealt population, then of the largest pooled one
    together with its driver memory."""
    fields = []
    dealt = [r for r in rows if r["clients"] <= LARGEST_DEALT]
    pooled = [r for r in rows if r["clients"] > LARGEST_DEALT]
    if dealt:
        row = max(dealt, key=lambda r: r["clients"])
        label = population_label(row["clients"])
        fields += [f"server_mem_mb_{label}={row['server_peak_mb']:.1f}", f"round_s_{label}={row['round_s']:.3f}"]
    if pooled:
        row = max(pooled, key=lambda r: r["clients"])
        label = population_label(row["clients"])
        fields += [
            f"server_mem_mb_{label}={row['server_peak_mb']:.1f}",
            f"driver_mem_mb_{label}={row['driver_peak_mb']:.1f}",
            f"round_s_{label}={row['round_s']:.3f}",
        ]
    return fields


if __name__ == "__main__":
    sys.exit(main())
