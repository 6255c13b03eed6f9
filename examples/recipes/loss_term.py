"""Recipe 1, a loss term: cross-entropy of logits adjusted by each client's own label prior.

Logit adjustment (Menon, Jayasumana, Rawat, Jain, Veit and Kumar, "Long-tail learning via logit adjustment",
ICLR 2021) trains on the cross-entropy of the logits shifted by τ·log π, π the label prior; here π is each client's
own (the class frequencies of its training split, plus one sample of every class), the idea FedLC (Zhang et al.,
"Federated Learning with Label Distribution Skew via Logits Calibration", ICML 2022) brings to federated learning.
The shifted cross-entropy replaces the plain one (``cross_entropy=False``), so a client's rare classes weigh more.
The server averages the models (FedAvg's); clients are evaluated with the global model's plain logits.

    python examples/recipes/loss_term.py            # rayfed check: stacks? equal losses? sizes?
    rayfed check examples/recipes/loss_term.py      # the same, from the command line

docs/methods.md, "Recipe 1: a loss term".
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

import rayfed
from rayfed.algorithms import register_algorithm
from rayfed.algorithms.common.global_model import GlobalModel, GlobalModelClient
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.train.job import ClientJob
from rayfed.train.phase import Batch, Constants, Outputs, Params, Phase


@dataclass(frozen=True)
class LogitAdjustParams:
    """``algorithm.params`` of the method: τ, how far the logits move by the log prior."""

    tau: float = 1.0


class LogitAdjustClient(GlobalModelClient[LogitAdjustParams, GlobalModel]):
    """FedAvg's client (it starts from the global model and sends its model, weighted by its samples), training on
    the cross-entropy of its adjusted logits."""

    def phases(self, message: GlobalModel, job: ClientJob) -> list[Phase]:
        counts = job.train_label_counts.astype(np.float32) + 1.0  # one sample of every class: no log(0)
        log_prior = torch.as_tensor(np.log(counts / counts.sum()), device=job.device)
        return [
            Phase(
                epochs=job.train.local_epochs,
                loss=self.adjusted_cross_entropy,
                cross_entropy=False,  # the loss is the whole loss, not a term added to the plain cross-entropy
                constants={"log_prior": log_prior},  # this client's value; the function is every client's
            )
        ]

    def adjusted_cross_entropy(self, out: Outputs, batch: Batch, params: Params, constants: Constants) -> torch.Tensor:
        """Mean over the batch of CE(logits + τ·log π, y); a stack's padded samples weigh 0 (``batch.weight``)."""
        logits = out.logits + self.params.tau * constants["log_prior"]
        per_sample = F.cross_entropy(logits, batch.y, reduction="none")
        if batch.weight is None:
            return per_sample.mean()
        return (per_sample * batch.weight).sum() / batch.weight.sum()


register_algorithm(
    "logit_adjust",
    params=LogitAdjustParams,
    server=FedAvgServer,
    client=LogitAdjustClient,
    summary="Logit adjustment by each client's label prior (Menon et al. 2021; FedLC's idea), FedAvg's server",
)


if __name__ == "__main__":
    report = rayfed.check("logit_adjust")
    print(report)
    sys.exit(0 if report.ok else 1)
