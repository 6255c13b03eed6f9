"""The motivating example of cwFedAvg (cwFedAvg, ICCV 2025, §3.2), in plain torch.

Two Gaussian classes in R^3; three clients with 2700/300, 200/1800 and 500/500 samples
of classes 0/1; a network with one hidden layer of four ReLU units (3 -> 4 -> 2). Each
client splits its data 75/25 into train and test. Three methods train for the same
rounds (1 local epoch of SGD, batch 10):

* FedAvg: one global model;
* cwFedAvg without WDR: p̃ from the output layer's row norms (Eq. 4), class-wise
  aggregation (Eq. 6) and personalisation (Eq. 7), all layers class-wise;
* cwFedAvg with WDR: the same, plus c·‖p_i − p̃_i‖₂ in every mini-batch (Eq. 8).

It prints each client's test accuracy under each method, and p_i next to p̃_i.
The math is the engine's own (``rayfed.algorithms.cwfedavg``); no Ray is involved.

    python examples/motivating_example.py [--rounds 20] [--wdr-lambda 10] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from rayfed.algorithms.cwfedavg_equations import (
    classwise_aggregate,
    distribution_from_norms,
    empirical_distribution,
    output_row_norms,
    personalise,
    wdr_penalty,
)

CLIENT_COUNTS = ((2700, 300), (200, 1800), (500, 500))
CENTRES = np.array([[0.5, 0.5, 0.5], [-0.5, -0.5, -0.5]])
K = 2


def make_clients(rng: np.random.Generator) -> list[dict[str, torch.Tensor]]:
    """Each client's Gaussian samples around the two centres, split 75/25 (shuffled, not stratified)."""
    clients = []
    for counts in CLIENT_COUNTS:
        y = np.repeat(np.arange(K), counts)
        x = CENTRES[y] + rng.normal(size=(len(y), 3))
        order = rng.permutation(len(y))
        cut = int(0.75 * len(y))
        train, test = order[:cut], order[cut:]
        clients.append(
            {
                "x_train": torch.tensor(x[train], dtype=torch.float32),
                "y_train": torch.tensor(y[train]),
                "x_test": torch.tensor(x[test], dtype=torch.float32),
                "y_test": torch.tensor(y[test]),
                "p": torch.tensor(empirical_distribution(np.array(counts)), dtype=torch.float32),
            }
        )
    return clients


def make_model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, K))


def train_locally(
    model: nn.Sequential, data: dict[str, torch.Tensor], lr: float, wdr: float, gen: torch.Generator
) -> None:
    """One epoch of SGD, batch 10, drop_last; loss = CE (+ wdr·‖p − p̃(W)‖₂ on the output weight)."""
    params = list(model.parameters())
    n = len(data["y_train"])
    order = torch.randperm(n, generator=gen)
    for start in range(0, n - n % 10, 10):
        idx = order[start : start + 10]
        loss = F.cross_entropy(model(data["x_train"][idx]), data["y_train"][idx])
        if wdr:
            loss = loss + wdr_penalty(data["p"], model[2].weight, wdr)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():  # plain SGD, as torch.optim.SGD without momentum
            for param, g in zip(params, grads):
                param.add_(g, alpha=-lr)


@torch.no_grad()
def accuracy(model: nn.Sequential, data: dict[str, torch.Tensor]) -> float:
    return float((model(data["x_test"]).argmax(1) == data["y_test"]).float().mean())


def run(
    method: str, clients: list[dict[str, torch.Tensor]], rounds: int, lr: float, wdr_lambda: float, seed: int
) -> tuple[list[float], np.ndarray]:
    """Train ``method`` ("fedavg", "cw", "cw+wdr"); return final per-client accuracies and p̃ rows."""
    torch.manual_seed(seed)
    model = make_model()
    init = parameters_to_vector(model.parameters()).detach().numpy()
    sizes = np.array([len(c["y_train"]) for c in clients])
    heads = np.tile(init, (K, 1))  # G_1..G_K; for FedAvg only heads[0] is used
    p_tilde = np.full((len(clients), K), 1.0 / K)
    coefficient = 0.5 * wdr_lambda if method == "cw+wdr" else 0.0  # the code's 0.5·λ
    gen = torch.Generator().manual_seed(seed)

    def start_of(i: int) -> np.ndarray:
        return heads[0] if method == "fedavg" else personalise(p_tilde[i], heads)  # Eq. 7

    for _ in range(rounds):
        thetas, rows = [], []
        for i, data in enumerate(clients):
            vector_to_parameters(torch.from_numpy(start_of(i)), model.parameters())
            train_locally(model, data, lr, coefficient, gen)
            thetas.append(parameters_to_vector(model.parameters()).detach().numpy().copy())
            rows.append(distribution_from_norms(output_row_norms(model[2].weight.detach().numpy())))  # Eq. 4
        thetas_arr = np.stack(thetas)
        if method == "fedavg":
            heads = np.tile((sizes[:, None] * thetas_arr).sum(0) / sizes.sum(), (K, 1)).astype(np.float32)
        else:
            p_tilde = np.stack(rows)
            heads = classwise_aggregate(thetas_arr, sizes, p_tilde, heads)  # Eq. 6
    accuracies = []
    for i, data in enumerate(clients):
        vector_to_parameters(torch.from_numpy(start_of(i)), model.parameters())
        accuracies.append(accuracy(model, data))
    return accuracies, np.stack(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--wdr-lambda", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    clients = make_clients(np.random.default_rng(args.seed))
    results = {m: run(m, clients, args.rounds, args.lr, args.wdr_lambda, args.seed) for m in ("fedavg", "cw", "cw+wdr")}

    print(f"{args.rounds} rounds, lr {args.lr}, batch 10, 1 local epoch, WDR λ = {args.wdr_lambda:g} (c = 0.5·λ)")
    print(f"{'client':<8}{'classes 0/1':>13}{'FedAvg':>9}{'cw w/o WDR':>12}{'cw w/ WDR':>11}")
    for i, counts in enumerate(CLIENT_COUNTS):
        accs = [results[m][0][i] for m in results]
        cells = "".join(f"{a:>{w}.3f}" for a, w in zip(accs, (9, 12, 11)))
        print(f"{i + 1:<8}{f'{counts[0]}/{counts[1]}':>13}{cells}")
    tests = np.array([len(c["y_test"]) for c in clients])
    pooled = [float((np.array(results[m][0]) * tests).sum() / tests.sum()) for m in results]
    print(f"{'pooled':<21}" + "".join(f"{a:>{w}.3f}" for a, w in zip(pooled, (9, 12, 11))))
    print("\nclass distribution p_i and the estimate p̃_i (Eq. 4) after the last round")
    print(f"{'client':<8}{'p_i':>16}{'p̃_i w/o WDR':>18}{'p̃_i w/ WDR':>18}")
    for i, data in enumerate(clients):
        cells = [data["p"].numpy(), results["cw"][1][i], results["cw+wdr"][1][i]]
        print(
            f"{i + 1:<8}"
            + "".join(f"{np.array2string(c, precision=3, floatmode='fixed'):>{w}}" for c, w in zip(cells, (16, 18, 18)))
        )


if __name__ == "__main__":
    main()
