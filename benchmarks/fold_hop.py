"""What one hop of folding costs: a chain of two folds over two Ray nodes against the server fetching the sums.

Two worker nodes of a ``ray.cluster_utils.Cluster`` on this box (the head holds the driver and the adding
actor) each hold four model-sized arrays (2.3 MB, the 4-layer CNN). ``chain``: an actor on the first node adds
its four, one on the second adds the first's total and its own four, and the head's actor fetches that one
total: the order of ``engine.fold_sums`` (``rayfed.actors.folding``). ``star``: the head's actor fetches the
eight arrays itself, as rayfed does by default. Prints both per trial (the first warms up) and the medians.

    python benchmarks/fold_hop.py [--trials 6]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import numpy as np

FLOATS = 2_300_000 // 4
PARTS_PER_NODE = 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    args = parser.parse_args(argv)

    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0.05)
    class Folder:
        def make(self) -> np.ndarray:
            return np.ones(FLOATS, np.float32)

        def fold(self, total: np.ndarray | None, *parts: np.ndarray) -> np.ndarray:
            for part in parts:
                total = part.copy() if total is None else total + part
            assert total is not None
            return total

    @ray.remote(num_cpus=0)
    class Adder:
        def add(self, *parts: np.ndarray) -> float:
            return float(sum(part[0] for part in parts))

    def on(node_id: str) -> NodeAffinitySchedulingStrategy:
        return NodeAffinitySchedulingStrategy(node_id, soft=False)

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        ray.init(address=cluster.address, logging_level=logging.WARNING)  # first: the driver attaches to the head
        nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
        first, second = (Folder.options(scheduling_strategy=on(n.node_id)).remote() for n in nodes)  # type: ignore[attr-defined]
        adder = Adder.options(scheduling_strategy=on(ray.get_runtime_context().get_node_id())).remote()  # type: ignore[attr-defined]

        def parts() -> tuple[list, list]:
            made = (
                [first.make.remote() for _ in range(PARTS_PER_NODE)],
                [second.make.remote() for _ in range(PARTS_PER_NODE)],
            )
            ray.get([*made[0], *made[1]])
            return made

        chains, stars = [], []
        for trial in range(args.trials):
            a, b = parts()
            started = time.perf_counter()
            ray.get(adder.add.remote(second.fold.remote(first.fold.remote(None, *a), *b)))
            chain = 1e3 * (time.perf_counter() - started)
            a, b = parts()
            started = time.perf_counter()
            ray.get(adder.add.remote(*a, *b))
            star = 1e3 * (time.perf_counter() - started)
            print(f"trial {trial}: chain {chain:6.1f} ms  star {star:6.1f} ms", flush=True)
            if trial:
                chains.append(chain)
                stars.append(star)
    finally:
        ray.shutdown()
        cluster.shutdown()
    chain, star = statistics.median(chains), statistics.median(stars)
    print(f"chain_ms={chain:.1f} star_ms={star:.1f} extra_ms_per_hop={(chain - star) / 2:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
