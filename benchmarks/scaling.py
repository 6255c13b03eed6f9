"""Server memory and seconds per round of cwFedAvg (Output) as the client population grows.

Populations of 100; 1,000; 10,000 and 100,000 clients, 100 of them sampled per round,
on the offline synthetic dataset (1x28x28, 15 samples per client, IID, split 10 train /
5 test so that every client takes one SGD step of batch 10), the 4-layer CNN, WDR with
λ = 10. Each round trains the sampled clients, aggregates and evaluates the *sampled*
clients (``engine.eval_clients="sampled"``): evaluating all 100,000 personalised models
every round would dominate the round and measure evaluation, not the engine.

What the server keeps in cwFedAvg (Output) is K heads, the shared layers and two M x K
tables (p̃ and the row norms), so its memory should grow by 80 bytes per client (M x K
float32 twice, K = 10) and the round time should not grow with M. Measured per population:

* ``server_peak_mb``: peak resident memory of the ``ServerActor`` process (``ru_maxrss``),
  ``server_start_mb`` its resident memory right after it was created and
  ``server_state_mb`` the bytes of its state arrays;
* ``round_s``: median wall-clock seconds per round after the first (warm-up) round;
* ``setup_s``: generating the dataset, partitioning and building the model (driver).

Writes ``scaling.parquet`` and ``scaling.png`` to ``--out`` (default benchmarks/results);
the last line is ``server_mem_mb_100k=<peak MB> round_s_100k=<seconds>``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RoundTimer, median_after_warmup, private_ray  # noqa: E402

from rayfed import RunConfig, Simulation  # noqa: E402

SAMPLES_PER_CLIENT = 15
TRAIN_PER_CLIENT = 10
SAMPLED_PER_ROUND = 100
MB = 2**20


def rss_bytes(pid: int) -> int:
    """Resident memory of a process on this machine (Linux ``/proc``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class ServerMemory(RoundTimer):
    """Round times, plus the ServerActor's resident memory at the start and its peak at the end."""

    def on_run_start(self, sim) -> None:
        import ray

        pid = ray.get(sim.executor.server.pid.remote())
        self.start_bytes = rss_bytes(pid)
        super().on_run_start(sim)

    def on_run_end(self, sim) -> None:
        import ray

        server = sim.executor.server
        self.peak_bytes = ray.get(server.peak_rss_bytes.remote())
        self.state_bytes = ray.get(server.memory_bytes.remote())


def population_config(clients: int, args: argparse.Namespace, run_dir: Path) -> RunConfig:
    return RunConfig().override({
        "algorithm.name": "cwfedavg",
        "algorithm.params.wdr_lambda": 10.0,
        "algorithm.params.classwise_blocks": 1,  # cwFedAvg (Output)
        "data.dataset": "synthetic",
        "data.options": {"num_samples": SAMPLES_PER_CLIENT * clients},
        "data.num_clients": clients,
        "data.partition": "iid",
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
    })


def measure(clients: int, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    probe = ServerMemory()
    started = time.perf_counter()
    sim = Simulation(population_config(clients, args, tmp / f"m{clients}"), callbacks=[probe])
    setup_s = time.perf_counter() - started
    result = sim.run()
    return {
        "clients": clients,
        "sampled_per_round": int(result.history[0]["num_sampled"]),
        "rounds": result.rounds_run,
        "round_s": median_after_warmup(probe.seconds),
        "round_s_max": max(probe.seconds[1:] or probe.seconds),
        "server_start_mb": probe.start_bytes / MB,
        "server_peak_mb": probe.peak_bytes / MB,
        "server_state_mb": probe.state_bytes / MB,
        "driver_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
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
    mem.axhline(2048, color="grey", lw=0.8, ls="--", label="2 GB budget")
    mem.set(xscale="log", yscale="log", xlabel="clients (population)", ylabel="MB",
            title="cwFedAvg (Output): server memory")
    mem.legend(fontsize=8)
    sec.plot(clients, [r["round_s"] for r in rows], "o-")
    sec.set(xscale="log", xlabel="clients (population)", ylabel="seconds per round (median)",
            title=f"{SAMPLED_PER_ROUND} clients sampled per round")
    sec.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--populations", default="100,1000,10000,100000", help="comma-separated client counts")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per population; the first is warm-up")
    parser.add_argument("--workers", type=int, default=0, help="ClientWorker actors (0 = one per CPU)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    populations = [int(p) for p in args.populations.split(",") if p.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rayfed-scaling-") as tmp, private_ray():
        for clients in populations:
            row = measure(clients, args, Path(tmp))
            rows.append(row)
            print(f"{clients:>7} clients: {row['round_s']:.3f} s/round (max {row['round_s_max']:.3f}), "
                  f"server peak {row['server_peak_mb']:.0f} MB (start {row['server_start_mb']:.0f} MB, "
                  f"state {row['server_state_mb']:.1f} MB), driver peak {row['driver_peak_mb']:.0f} MB, "
                  f"setup {row['setup_s']:.1f} s, accuracy {row['accuracy']:.3f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), args.out / "scaling.parquet")
    plot(rows, args.out / "scaling.png")
    print(f"wrote {args.out / 'scaling.parquet'} and {args.out / 'scaling.png'}")
    last = rows[-1]
    label = f"{last['clients'] // 1000}k" if last["clients"] % 1000 == 0 else str(last["clients"])
    print(f"server_mem_mb_{label}={last['server_peak_mb']:.1f} round_s_{label}={last['round_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
