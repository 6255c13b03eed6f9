"""Server aggregation time of FedAvg, cwFedAvg, FedAWA, FedAWA-L, L-DAWA, FedDisco and FedLAW (P-AWA Tab. 2),
and FedAWA's whole round.

    python benchmarks/aggregation_time.py [--repeats 20] [--clients 20] [--seed 0] [--rounds 3] [--runs 2]
        [--fedlaw-repeats 3] [--fedlaw-epochs 100] [--no-round]

**Aggregation.** For ResNet-20 (3×32×32, K = 10) and the 4-layer CNN (cnn4, 1×28×28,
K = 10): one global model θ_g (the model's seeded initialisation) and 20 seeded random
client models θ_k = θ_g + τ_k around it, τ_k = σ·(u + z_k) with a direction u shared by
all clients, z_k ~ N(0, I) per client and σ = 0.01. Every algorithm gets the same 20
uploads and the timer runs from the uploads, as the server holds them, to the new global
state:

* ``fedavg``: Σ_k n_k θ_k / Σ_k n_k as one GEMV over the (20, S) stack of the uploads
  (the honest baseline: no Python loop, no copy);
* ``fedavg (engine)``: for reference, the engine's path, 20 :class:`WeightedSum`
  uploads (built by the workers, untimed) summed on the server, then averaged;
* ``fedawa*``: ``server.aggregate`` on the (20, S) stack of client vectors τ_k (one
  :class:`ClientVectors` upload, as merged by the engine), in each fidelity with its
  defaults (``code`` and ``paper``: one Adam step, matrix-free; ``exact``: the Gram
  matrix and the projected-gradient minimiser). Where the server asks for them (its
  broadcast's ``norm_slices``: the matrix-free fidelities), the upload holds the squared
  norms of its rows, made by the workers once they read their rows back (untimed, as
  cwfedavg's uploads below);
* ``fedawa (code), norms on the server``: for reference, the default fidelity given the rows
  alone (as from a client half that does not send the norms): one more pass over them;
* ``cwfedavg`` (when registered): its 20 uploads built by its broadcast on the workers
  (untimed), then summed and aggregated on the server;
* ``ldawa``: ``server.aggregate`` on the (20, S) stack of whole models (per-layer cosines to
  θ_g as segment sums, then the scaled mean);
* ``feddisco``: ``server.aggregate`` on the whole models with each client's label histogram
  (seeded multinomial counts): the weights, then one GEMV;
* ``fedlaw`` (when registered, timed apart with ``--fedlaw-repeats``, default 3, since one
  aggregation runs ``--fedlaw-epochs`` passes of forward and backward through the merged model
  over a 200-image random proxy set): ``server.aggregate`` on the whole models;
* ``gram T Tᵀ alone``: the Gram matrix of the 20 client vectors (parameters), one BLAS
  SYRK, nothing else. An exact FedAWA on the server computes it after the last upload
  and reads the uploads once more to combine them, so one GEMV plus this is the
  ``floor`` the FedAWA rows are compared with (``x floor``). With a single Adam step the
  default fidelity needs no Gram matrix: it reads the rows five times, in GEMVs (b = T θ_g,
  then T(Tᵀλ) and T(Tᵀw) for the two products of its gradient; the aggregate is the Tᵀλ
  already made), so it can beat the floor where a SYRK costs more than four GEMVs.

Each is timed ``--repeats`` times, interleaved, and the median is reported with its ratios
to ``fedavg`` and to the floor. BLAS and torch use one thread, as the engine's actors do,
and the clock is this process's CPU time (``time.process_time``): on a shared machine,
wall time also counts the time other processes hold the core.

**Whole round.** FedAWA (default fidelity) against FedAvg on the same clients and data:
cnn4, 20 clients on the offline synthetic dataset (Dirichlet 0.1), the clients of the
FedAWA table (SGD momentum 0.9 kept across rounds, so FedAvg borrows FedAWA's client half,
``algorithm.client=sgdm``, and only the server half differs), ``engine.backend=local``
(one process). ``--runs`` runs of each, interleaved (FedAvg, FedAWA, FedAvg, ...), of
``--rounds`` rounds each; a round's time is the process CPU time from the end of the
previous round to the end of this one (train + aggregate + evaluate + the metrics files),
and the ratio is of the medians over all rounds but each run's first.

The last line is ``fedawa_vs_floor=<x> fedawa_l_vs_floor=<y> fedawa_round_vs_fedavg=<z>``:
ResNet-20 aggregation in the default fidelity over its floor, and the whole-round ratio (left out with
``--no-round``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads BLAS: one thread, as in the actors
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RoundTimer  # noqa: E402  (sibling module of the benchmark scripts)

import rayfed  # noqa: E402
from rayfed.algorithms import (  # noqa: E402
    ALGORITHMS,
    Contribution,
    RoundContext,
    ServerHalf,
    WeightedSum,
    sum_contributions,
)
from rayfed.algorithms.contributions import ClientVectors  # noqa: E402
from rayfed.algorithms.fedawa import FIDELITIES, FedAWAParams  # noqa: E402
from rayfed.config import TrainConfig  # noqa: E402
from rayfed.models import block_names, build_model, output_layer_name  # noqa: E402
from rayfed.train.flat import FlatModel  # noqa: E402
from rayfed.train.host import to_host  # noqa: E402
from rayfed.train.job import ClientJob  # noqa: E402
from rayfed.train.problem import ProblemSpec  # noqa: E402

MODELS = (("resnet20", (3, 32, 32)), ("cnn4", (1, 28, 28)))
GRAM = "gram T Tᵀ alone"
NUM_CLASSES = 10
SIGMA = 0.01


def _problem(name: str, shape: tuple[int, int, int], clients: int, seed: int):
    torch.manual_seed(seed)
    flat = FlatModel(build_model(name, shape, NUM_CLASSES))
    spec = ProblemSpec(
        num_clients=clients,
        num_classes=NUM_CLASSES,
        input_shape=shape,
        layouts={name: flat.layout},
        blocks={name: tuple(block_names(flat.module))},
        output_layer={name: output_layer_name(flat.module)},
        default_architecture=name,
        buffer_layouts={name: flat.buffer_layout},
    )
    theta_g = flat.state_numpy()
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal(theta_g.size, dtype=np.float32)
    taus = SIGMA * (shared + rng.standard_normal((clients, theta_g.size), dtype=np.float32))
    sizes = rng.integers(500, 3000, size=clients).astype(np.float64)
    return flat, spec, theta_g, taus, sizes


def _job(flat: FlatModel, cid: int, size: int, labels: np.ndarray) -> ClientJob:
    empty = torch.empty(0)
    return ClientJob(
        client_id=cid,
        round=0,
        worker_model=flat,
        architecture="",
        x_train=empty,
        y_train=torch.zeros(size),
        x_test=empty,
        y_test=empty,
        label_counts=labels,
        train_label_counts=labels,
        train=TrainConfig(batch_size=1, drop_last=False),
        lr=TrainConfig().lr,
        generator=torch.Generator(),
    )


def _timers(name: str, shape: tuple[int, int, int], clients: int, seed: int) -> dict[str, Callable[[], object]]:
    """Name -> a function that runs one aggregation from the same 20 uploads."""
    flat, spec, theta_g, taus, sizes = _problem(name, shape, clients, seed)
    ids = np.arange(clients, dtype=np.int64)
    ctx = RoundContext(round=0, seed=seed, lr=0.0, sampled=ids)
    initial = {name: theta_g}
    models = theta_g + taus  # θ_k, what FedAvg's clients send
    fractions = (sizes / sizes.sum()).astype(np.float32)
    timers: dict[str, Callable[[], object]] = {"fedavg": lambda: fractions @ models}

    uploads = [WeightedSum.of(m, n) for m, n in zip(models, sizes)]
    timers["fedavg (engine)"] = lambda: sum_contributions(uploads).average()  # type: ignore[union-attr]

    params = taus[:, : flat.layout.size]
    timers[GRAM] = lambda: params @ params.T  # BLAS SYRK: what any exact server-side FedAWA must compute

    for algorithm in ("fedawa", "fedawa_l"):
        for fidelity in FIDELITIES:
            server = ALGORITHMS.get(algorithm).server_half(FedAWAParams(fidelity=fidelity), spec, initial)
            slices = server.broadcast().norm_slices  # the workers' part (the norms they make): untimed
            vectors = ClientVectors((taus,), ids, sizes, None, slices).with_square_norms()
            timers[f"{algorithm} ({fidelity})"] = _fresh(server, ctx, vectors)
    server = ALGORITHMS.get("fedawa").server_half(FedAWAParams(), spec, initial)
    timers[f"fedawa ({FIDELITIES[0]}), norms on the server"] = _fresh(server, ctx, ClientVectors((taus,), ids, sizes))

    labels = np.random.default_rng(seed + 1).multinomial(1000, np.full(NUM_CLASSES, 0.1), size=clients)
    whole = ClientVectors((models,), ids, sizes)
    ldawa = ALGORITHMS.get("ldawa")
    # warmup_rounds=0: the layer-wise rule itself (its default first rounds are FedAvg's average)
    timers["ldawa"] = _fresh(ldawa.server_half(ldawa.params_type(warmup_rounds=0), spec, initial), ctx, whole)
    disco = ALGORITHMS.get("feddisco")
    timers["feddisco"] = _fresh(
        disco.server_half(disco.params_type(), spec, initial), ctx, ClientVectors((models,), ids, sizes, labels)
    )

    if "cwfedavg" in ALGORITHMS:
        algorithm = ALGORITHMS.get("cwfedavg")
        server = algorithm.server_half(algorithm.params_type(), spec, initial)
        client = algorithm.client_half(algorithm.params_type(), spec)
        message = server.broadcast()
        labels = np.random.default_rng(seed).multinomial(1000, np.full(NUM_CLASSES, 0.1), size=clients)
        cw_uploads = []
        for cid in range(clients):  # the workers' part (an upload, read back as a worker's call does): untimed
            flat.load_state(models[cid])
            upload = client.upload(message, _job(flat, cid, int(sizes[cid]), labels[cid]))
            cw_uploads.append(upload.with_host_arrays(to_host(upload.device_tensors())))
        timers["cwfedavg"] = _fresh(server, ctx, cw_uploads)
    return timers


class _fresh:
    """``server.aggregate(ctx, Σ uploads)`` from the server's first state on every call; the
    reset runs before the timer starts (``reset``), the aggregation is what is timed."""

    def __init__(self, server: ServerHalf, ctx: RoundContext, uploads: Contribution | list[Contribution]) -> None:
        self.server, self.ctx, self.uploads = server, ctx, uploads
        self.first = {k: np.array(v, copy=True) for k, v in server.state_dict().items()}

    def reset(self) -> None:
        self.server.load_state_dict(self.first)

    def __call__(self) -> object:
        total = self.uploads if isinstance(self.uploads, Contribution) else sum_contributions(self.uploads)
        return self.server.aggregate(self.ctx, total)


def fedlaw_seconds(
    name: str, shape: tuple[int, int, int], clients: int, seed: int, repeats: int, epochs: int
) -> float | None:
    """Median CPU seconds of one FedLAW aggregation (``None`` if ``fedlaw`` is not registered)."""
    if "fedlaw" not in ALGORITHMS:
        return None
    from dataclasses import replace

    from rayfed.data.held_out import HeldOutSet

    flat, spec, theta_g, taus, sizes = _problem(name, shape, clients, seed)
    rng = np.random.default_rng(seed)
    proxy = 200
    held_out = HeldOutSet(
        np.arange(proxy),
        rng.integers(0, 256, size=(proxy, *shape), dtype=np.uint8),
        np.arange(proxy, dtype=np.int64) % NUM_CLASSES,
    )
    spec = replace(spec, held_out=held_out, mean=(0.5,) * shape[0], std=(0.25,) * shape[0])
    algorithm = ALGORITHMS.get("fedlaw")
    server = algorithm.server_half(algorithm.params_type(server_epochs=epochs), spec, {name: theta_g})
    ids = np.arange(clients, dtype=np.int64)
    ctx = RoundContext(round=0, seed=seed, lr=0.0, sampled=ids)
    timer = _fresh(server, ctx, ClientVectors((theta_g + taus,), ids, sizes))
    samples = []
    for _ in range(repeats):
        timer.reset()
        start = time.process_time()
        timer()
        samples.append(time.process_time() - start)
    return statistics.median(samples)


def _measure(timers: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for fn in timers.values():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in timers.items():  # interleaved, so drifts in machine load hit every algorithm alike
            if isinstance(fn, _fresh):
                fn.reset()
            start = time.process_time()
            fn()
            samples[name].append(time.process_time() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def _round_config(
    algorithm: dict[str, object], rounds: int, clients: int, seed: int, run_dir: Path
) -> rayfed.RunConfig:
    """cnn4, ``clients`` clients on the synthetic dataset, the FedAWA table's clients, in one process."""
    return rayfed.RunConfig().override(
        {
            **algorithm,
            "data.dataset": "synthetic",
            "data.options": {"num_samples": 500 * clients},
            "data.num_clients": clients,
            "data.partition": "dirichlet",
            "data.alpha": 0.1,
            "data.train_fraction": 0.7,
            "model.name": "cnn4",
            "train.rounds": rounds,
            "train.lr": 0.01,
            "train.momentum": 0.9,
            "train.weight_decay": 5e-4,
            "train.batch_size": 50,
            "engine.backend": "local",
            "engine.progress": False,
            "engine.checkpoint_every": 0,
            "seed": seed,
            "run_dir": str(run_dir),
        }
    )


class _CpuRoundTimer(RoundTimer):
    clock = staticmethod(time.process_time)


def round_ratio(rounds: int, runs: int, clients: int, seed: int) -> tuple[float, float]:
    """Median whole-round CPU seconds of FedAvg and of FedAWA (default fidelity), runs interleaved."""
    methods = {
        "fedavg": {"algorithm.name": "fedavg", "algorithm.client": "sgdm"},
        "fedawa": {"algorithm.name": "fedawa"},
    }
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(runs):
            for name, algorithm in methods.items():
                timer = _CpuRoundTimer()
                rayfed.run(
                    _round_config(algorithm, rounds, clients, seed, Path(tmp) / f"{name}-{run}"), callbacks=[timer]
                )
                seconds[name] += timer.seconds[1:]  # each run's first round builds what later rounds reuse
    return statistics.median(seconds["fedavg"]), statistics.median(seconds["fedawa"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per whole-round run (default 3)")
    parser.add_argument("--runs", type=int, default=2, help="whole-round runs per algorithm (default 2)")
    parser.add_argument("--fedlaw-repeats", type=int, default=3, help="FedLAW aggregations timed (default 3)")
    parser.add_argument("--fedlaw-epochs", type=int, default=100, help="FedLAW server epochs (default 100)")
    parser.add_argument("--no-round", action="store_true", help="skip the whole-round comparison")
    args = parser.parse_args()
    torch.set_num_threads(1)
    floor_ratios: dict[str, dict[str, float]] = {}
    print(f"median server aggregation CPU time, {args.clients} clients, {args.repeats} repeats, 1 thread")
    print(f"{'model':9s} {'algorithm':34s} {'ms':>9s} {'x fedavg':>9s} {'x floor':>9s}")
    for name, shape in MODELS:
        medians = _measure(_timers(name, shape, args.clients, args.seed), args.repeats)
        base = medians["fedavg"]
        floor = base + medians[GRAM]
        floor_ratios[name] = {k: v / floor for k, v in medians.items()}
        try:
            law = fedlaw_seconds(name, shape, args.clients, args.seed, args.fedlaw_repeats, args.fedlaw_epochs)
        except RuntimeError as error:  # reported, not fatal: the other rows stand on their own
            print(f"{name:9s} fedlaw failed: {str(error).splitlines()[0]}")
            law = None
        if law is not None:
            medians[f"fedlaw ({args.fedlaw_epochs} ep)"] = law
        for algorithm, seconds in {**medians, "floor (GEMV + Gram)": floor}.items():
            print(f"{name:9s} {algorithm:34s} {seconds * 1e3:9.3f} {seconds / base:9.2f} {seconds / floor:9.2f}")
    if "cwfedavg" not in ALGORITHMS:
        print("cwfedavg: not registered in this tree, left out")
    if "fedlaw" not in ALGORITHMS:
        print("fedlaw: not registered in this tree, left out")
    print(
        "P-AWA Tab. 2 (ResNet-20, the authors' implementation): FedAvg 0.10 s, L-DAWA 2.52 s (25x), "
        "FedLAW 10.11 s (101x), FedAWA 0.82 s (8.2x), FedAWA-L 15.21 s (152x)"
    )
    default = FedAWAParams().fidelity
    resnet = floor_ratios["resnet20"]
    fields = [
        f"fedawa_vs_floor={resnet[f'fedawa ({default})']:.2f}",
        f"fedawa_l_vs_floor={resnet[f'fedawa_l ({default})']:.2f}",
    ]
    if not args.no_round:
        fedavg_round, fedawa_round = round_ratio(args.rounds, args.runs, args.clients, args.seed)
        print(
            f"whole round (cnn4, {args.clients} clients, synthetic, {args.runs} x {args.rounds} rounds interleaved, "
            f"CPU s, median over rounds 2+): fedavg+sgdm clients {fedavg_round:.3f}, fedawa {fedawa_round:.3f}"
        )
        fields.append(f"fedawa_round_vs_fedavg={fedawa_round / fedavg_round:.3f}")
    print(f"last line: ResNet-20 aggregation, default fidelity ({default}), over its floor; whole round over FedAvg")
    print(" ".join(fields))


if __name__ == "__main__":
    main()
