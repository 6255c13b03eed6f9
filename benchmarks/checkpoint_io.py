"""What saving and verifying a checkpoint cost: the seal (HMAC-SHA256 under the checkpoint key) is on that path.

A checkpoint of ``--mb`` MB of server state (float32 arrays of 1M values) and 100 clients' 1,000-value states is
saved and verified (as a resume reads it) ``--repeats`` times into a temporary folder, with a key of its own; the
median of each is printed.

    python benchmarks/checkpoint_io.py [--mb 40] [--repeats 7]

Last line: ``save_ms=<median> verify_ms=<median> mb=<size>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rayfed-checkpoint-io-") as folder:
        os.environ["RAYFED_CHECKPOINT_KEY_FILE"] = os.path.join(folder, "checkpoint.key")  # never the user's key
        from rayfed.engine.checkpoint import save_checkpoint, verified_checkpoint

        rng = np.random.default_rng(0)
        server = {f"w{i}": rng.standard_normal(1_000_000, dtype=np.float32) for i in range(args.mb // 4)}
        clients = [(c, {"m": rng.standard_normal(1000, dtype=np.float32)}) for c in range(100)]
        saves, verifies = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            path = save_checkpoint(folder, 0, server, clients, "identity")
            saves.append(time.perf_counter() - started)
            started = time.perf_counter()
            verified_checkpoint(path, "identity")
            verifies.append(time.perf_counter() - started)
    save_ms, verify_ms = statistics.median(saves) * 1000, statistics.median(verifies) * 1000
    print(f"save_ms={save_ms:.0f} verify_ms={verify_ms:.0f} mb={args.mb}")


if __name__ == "__main__":
    main()
