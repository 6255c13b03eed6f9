"""Evaluation of every client's personalised model: shared body against a forward per client.

The workload of ``examples/cwfedavg_1000clients.py``: cwFedAvg (Output), 1,000 clients of
the 70,000-image synthetic pool (pathological, 2 classes each, 18 test images per
client), after one round of 100 clients so that the clients' output layers differ. One
``ClientRunner`` (one torch thread, as a ClientWorker) evaluates the same clients three
ways, interleaved, repeats times:

* ``per_client``: each client's full personalised model, loaded and run on its own test
  split (what every client half without the ``SharedBodyEvaluation`` declaration does);
* ``shared_body``: cwFedAvg's ``SharedBodyEvaluation.shared_body``: one forward of G_avg's body over all the
  clients' test images, then each client's head Σ_j p̃_ij G_j as a batched product;
* ``forward_only``: the bare forward of one model over the same images in batches of
  1,024 (no personalisation, no heads): the least any exact evaluation of these images
  can cost on this device, since every test image belongs to exactly one client.

The last line is ``shared_over_per_client=<speed-up> forward_only_over_per_client=<bound>``.
Run: ``python benchmarks/shared_eval.py [--clients 1000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from rayfed import RunConfig
from rayfed.algorithms import RoundContext
from rayfed.algorithms.cwfedavg import CwFedAvgClient
from rayfed.data import load_dataset, make_partition
from rayfed.engine.problem_build import build_problem
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.evaluation import evaluate_clients
from rayfed.execution.reports import EvalReport
from rayfed.execution.server import Server


class PerClientEvaluation(CwFedAvgClient):
    """cwFedAvg's client half without the shared body: a full forward per client."""

    def shared_body(self, message, jobs):  # noqa: ANN001, ANN201
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = RunConfig().override(
        {
            "algorithm.name": "cwfedavg",
            "data.num_clients": args.clients,
            "data.partition": "pathological",
            "data.classes_per_client": 2,
            "data.balance": True,
            "engine.backend": "local",
        }
    )
    dataset = load_dataset("synthetic", None, options={})
    partition = make_partition(dataset.labels, dataset.num_classes, config.data)
    spec, initial = build_problem(config, dataset)
    runner, server = ClientRunner(config, spec, dataset, partition), Server(config, spec, initial)
    trained = list(range(min(100, args.clients)))
    ctx = RoundContext(round=0, seed=0, lr=config.train.lr, sampled=np.array(trained))
    server.aggregate(ctx, runner.train(server.broadcast(), ctx, trained).contribution)
    shared = server.broadcast()
    per_client = PerClientEvaluation(runner.client_half.params, runner.client_half.spec)
    ids = list(range(args.clients))
    model = runner.model_for(config.model.name).module
    x, _ = runner.gather(np.concatenate([partition.test(cid) for cid in ids]))

    def each_alone() -> list[EvalReport]:
        return evaluate_clients(runner, per_client, shared, ctx, ids, None, runner.evaluation_model)

    def forward_only() -> None:
        with torch.no_grad():
            model.eval()
            for start in range(0, len(x), 1024):
                model(x[start : start + 1024])

    seconds: dict[str, list[float]] = {"per_client": [], "shared_body": [], "forward_only": []}
    for _ in range(args.repeats):
        for name, work in (
            ("per_client", each_alone),
            ("shared_body", lambda: runner.evaluate(shared, ctx, ids)),
            ("forward_only", forward_only),
        ):
            started = time.perf_counter()
            work()
            seconds[name].append(time.perf_counter() - started)
    reports = runner.evaluate(shared, ctx, ids), each_alone()
    same = [r.correct for r in reports[0]] == [r.correct for r in reports[1]]
    median = {name: statistics.median(values) for name, values in seconds.items()}
    print(
        f"{args.clients} clients, {len(x)} test images, medians over {args.repeats}: "
        + ", ".join(f"{name} {value:.2f} s" for name, value in median.items())
        + f"; same accuracies: {same}"
    )
    print(
        f"shared_over_per_client={median['per_client'] / median['shared_body']:.2f} "
        f"forward_only_over_per_client={median['per_client'] / median['forward_only']:.2f}"
    )


if __name__ == "__main__":
    main()
