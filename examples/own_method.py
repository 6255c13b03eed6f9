"""A method of your own, in your own file: registered here, and run by rayfed on Ray without forking it.

**HeadProx.** Each client keeps a personal output layer (its head) and shares the rest of the model (the body), as
FedPer does; the server averages the bodies it receives, weighted by the clients' training samples; and local
training adds FedProx's proximal term on the body alone,

    (μ/2) ‖body − body_g‖²,   body_g = the body the client received this round,

so that the shared representation drifts less while each head fits its client's labels. The method is a params
dataclass, a client half (its phases: one loss term) and a server half, registered at the bottom of this file;
everything else (the personal heads kept in the client state store, the averaged body, evaluation with each
client's own head) comes from rayfed's building blocks for body/head methods.

Run it:

    python examples/own_method.py [--rounds 5] [--mu 0.01] [--workers 2]

It trains the same config twice, in this process (``engine.backend=local``) and on a local Ray with two
ClientWorkers and the ServerActor (``engine.backend=ray``), and prints each round's accuracy of both: the numbers
agree to the last digit (exit 1 if they do not). Ray's workers import rayfed, not this script: the registration
travels to them with the run's config (docs/architecture.md, "A method of your own"). The run records this file
in its config's ``plugins``, so ``rayfed run --resume RUN_DIR`` finds the method again.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch

import rayfed
from rayfed.algorithms import register_algorithm
from rayfed.algorithms.common.body_head import (
    BodyHeadParams,
    PartialClient,
    PartialModels,
    PartialServer,
    split_body_head,
)
from rayfed.train.job import ClientJob
from rayfed.train.phase import Batch, Constants, Outputs, Params, Phase
from rayfed.train.problem import ProblemSpec


@dataclass(frozen=True)
class HeadProxParams(BodyHeadParams):
    """``algorithm.params`` of HeadProx: ``head_blocks`` (the personal layers, 1 = the output layer) and μ."""

    mu: float = 0.01


class HeadProxClient(PartialClient):
    """Local SGD on cross-entropy + (μ/2)‖body − body_g‖²; the head stays the client's (:class:`PartialClient`)."""

    params: HeadProxParams

    def __init__(self, params: HeadProxParams, spec: ProblemSpec) -> None:
        super().__init__(params, spec)
        (architecture,) = spec.layouts  # body/head methods run one architecture
        split = split_body_head(spec, architecture, params.head_blocks)
        self.body = spec.layouts[architecture].offsets.index(split.body_params.stop)
        """How many of the model's parameter tensors form its body (they come first)."""

    def phases(self, message: PartialModels, job: ClientJob) -> list[Phase]:
        return [Phase(epochs=job.train.local_epochs, loss=self.proximal_body)]

    def proximal_body(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        """(μ/2)‖body − body_g‖²: ``constants["start"]`` is the round's starting parameters, flattened in order."""
        body = torch.cat([p.reshape(-1) for p in params[: self.body]])
        return 0.5 * self.params.mu * (body - constants["start"][: body.numel()]).pow(2).sum()


class HeadProxServer(PartialServer):
    """Averages the bodies; the heads stay with their clients."""

    shared_part = "body"
    keep_local = True


register_algorithm(
    "headprox",
    params=HeadProxParams,
    server=HeadProxServer,
    client=HeadProxClient,
    summary="HeadProx (an example of a user's own method): personal heads, averaged bodies, a proximal body term",
    keeps_client_state=True,
)


def config(rounds: int, mu: float, backend: str, workers: int, run_dir: Path) -> rayfed.RunConfig:
    """The run: 10 clients of the offline synthetic images, two classes each; 5 rounds by default."""
    return rayfed.RunConfig().override(
        {
            "data.dataset": "synthetic",
            "data.options": {"num_samples": 3000},
            "data.num_clients": 10,
            "data.partition": "pathological",
            "data.classes_per_client": 2,
            "algorithm.name": "headprox",
            "algorithm.params": {"mu": mu},
            "train.rounds": rounds,
            "train.lr": 0.05,
            "engine.backend": backend,
            "engine.num_workers": workers,
            "engine.progress": False,
            "run_dir": str(run_dir),
        }
    )


def rounds(run_dir: Path) -> list[dict[str, object]]:
    """Every round's record of a run, but its wall-clock timings (they differ from run to run)."""
    rows = pq.read_table(run_dir / "rounds.parquet").to_pylist()
    return [{k: v for k, v in row.items() if not k.endswith(("_s", "_seconds"))} for row in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mu", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=2, help="ClientWorkers of the Ray run")
    parser.add_argument("--out", type=Path, default=None, help="where the two runs go (default: a temporary folder)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="headprox-"))
    runs = {}
    for backend in ("local", "ray"):
        run_dir = out / backend
        rayfed.run(config(args.rounds, args.mu, backend, args.workers if backend == "ray" else 0, run_dir))
        runs[backend] = rounds(run_dir)
    for local, on_ray in zip(runs["local"], runs["ray"]):
        print(
            f"round {local['round']}: accuracy local {local['accuracy']!r}  ray ({args.workers} workers) "
            f"{on_ray['accuracy']!r}; train loss {local['train_loss']!r} / {on_ray['train_loss']!r}"
        )
    same = json.dumps(runs["local"], sort_keys=True) == json.dumps(runs["ray"], sort_keys=True)  # NaN == NaN here
    print(f"same numbers on both backends: {same} (every metric of every round; runs in {out})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
