"""A digest of every registered method's numbers: the same config must give the same digest before and after a change.

Each method runs ``--rounds`` rounds (default 3) of a small seeded problem in-process (``engine.backend=local``,
synthetic 1x28x28 images, 6 clients, cnn4; FedClassAvg on ``fca_alexnet``), once sequentially
(``engine.vectorize=off``). The digest hashes every recorded metric except the wall-clock timings, the server's
state and every client's state after the last round, bit for bit. Compare two checkouts by their printed lines:

    python benchmarks/digest.py [--rounds 3] [--methods fedavg,ditto] [--without server_bytes_received] > digest.txt

``--without`` leaves named metrics out, for a change that alters them on purpose (an upload that carries more
bytes): every other number must still agree.

One line per method, ``<method> <digest> accuracy=<last round's pooled accuracy>``; the last line
``methods=<n> digest=<digest of all lines>``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from rayfed import RunConfig, run
from rayfed.algorithms import ALGORITHMS
from rayfed.engine.callbacks import Callback

OVERRIDES: dict[str, dict[str, Any]] = {
    "fedclassavg": {"model.name": "fca_alexnet"},
    "ktpfl": {"algorithm.params": {"public_size": 60}},
    "apple": {"algorithm.params": {"anneal_rounds": 2}},
    "fedlaw": {"algorithm.params": {"server_epochs": 2}},
    # the asynchronous methods run on devices (docs/system.md): their schedule needs a system model
    "fedasync": {"system.devices": "lognormal", "system.step_s": 0.05, "algorithm.params": {"concurrency": 3}},
    "fedbuff": {
        "system.devices": "lognormal",
        "system.step_s": 0.05,
        "algorithm.params": {"concurrency": 4, "buffer_size": 2},
    },
}


def is_timing(key: str) -> bool:
    """Metrics that measure wall-clock time (``round_s``, ``server_fedlaw_seconds``): they differ run to run. The
    system model's virtual time (``virtual_time_s``) is a number of the run, not a timing."""
    return key.endswith(("_s", "_seconds")) and key != "virtual_time_s"


class FinalStates(Callback):
    """The server's and the clients' states after the last round."""

    def __init__(self) -> None:
        self.server: dict[str, np.ndarray] = {}
        self.clients: dict[int, dict[str, np.ndarray]] = {}

    def after_round(self, run, record, clients) -> bool:
        self.server = {k: np.array(v) for k, v in run.server_state().items()}
        self.clients = {cid: {k: np.array(v) for k, v in state.items()} for cid, state in run.client_states()}
        return False


def method_digest(name: str, rounds: int, root: Path, without: frozenset[str] = frozenset()) -> tuple[str, float]:
    states = FinalStates()
    config = RunConfig().override(
        {
            "data.options": {"num_samples": 900},
            "data.num_clients": 6,
            "data.partition": "dirichlet",
            "data.alpha": 0.5,
            "model.name": "cnn4",
            "algorithm.name": name,
            "train.rounds": rounds,
            "train.batch_size": 10,
            "engine.backend": "local",
            "engine.progress": False,
            "engine.vectorize": "off",
            "engine.torch_threads": 1,
            "engine.eval_train_loss": True,
            "run_dir": str(root / name),
            **OVERRIDES.get(name, {}),
        }
    )
    result = run(config, callbacks=[states])
    digest = hashlib.sha256()
    for row in result.history:
        for key in sorted(row):
            if not is_timing(key) and key not in without:
                digest.update(f"{key}={row[key]!r};".encode())
    for key in sorted(states.server):
        digest.update(key.encode() + np.ascontiguousarray(states.server[key]).tobytes())
    for cid in sorted(states.clients):
        for key in sorted(states.clients[cid]):
            digest.update(f"{cid}.{key}".encode() + np.ascontiguousarray(states.clients[cid][key]).tobytes())
    return digest.hexdigest()[:16], result.final_accuracy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", default="", help="comma-separated methods (default: every registered one)")
    parser.add_argument("--without", default="", help="comma-separated metrics the digest leaves out")
    args = parser.parse_args(argv)
    without = frozenset(m for m in args.without.split(",") if m)
    methods = [m for m in args.methods.split(",") if m] or sorted(ALGORITHMS)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in methods:
            digest, accuracy = method_digest(name, args.rounds, Path(tmp), without)
            lines.append(f"{name} {digest} accuracy={accuracy:.4f}")
            print(lines[-1], flush=True)
    print(f"methods={len(methods)} digest={hashlib.sha256(chr(10).join(lines).encode()).hexdigest()[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
