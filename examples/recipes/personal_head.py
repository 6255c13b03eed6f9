"""Recipe 2, a personal head: each client keeps its own output layer; the server averages the rest (the body).

As FedPer (Arivazhagan, Aggarwal, Singh and Choudhary, "Federated Learning with Personalization Layers",
arXiv:1912.00818), with one change: each round a client first fits its own head to the body it received, one
epoch with the body fixed, then trains the whole model (FedRep, Collins et al. 2021, fits the head first too, but
then trains the body alone). The body/head building blocks do the rest: ``PartialClient`` starts a client from
the averaged body and the head it kept, uploads its body weighted by its samples and keeps its head in its state
(``job.state``); ``PartialServer`` averages the bodies; each client is evaluated with its own head.

    python examples/recipes/personal_head.py        # rayfed check: stacks? equal losses? sizes?

docs/methods.md, "Recipe 2: a personal head".
"""

from __future__ import annotations

import sys

import rayfed
from rayfed.algorithms import register_algorithm
from rayfed.algorithms.common.body_head import BodyHeadParams, PartialClient, PartialModels, PartialServer
from rayfed.train.job import ClientJob
from rayfed.train.phase import Phase


class HeadFirstClient(PartialClient):
    """One epoch on its head alone, then ``train.local_epochs`` on the whole model."""

    def phases(self, message: PartialModels, job: ClientJob) -> list[Phase]:
        head = message.split.head_params  # the head's range of the parameter vector
        return [
            Phase(epochs=1, trains=(head.start, head.stop), reports=False),  # the body does not move
            Phase(epochs=job.train.local_epochs),
        ]


class HeadFirstServer(PartialServer):
    """Averages the bodies (``shared_part``); the heads stay with their clients (``keep_local``)."""

    shared_part = "body"
    keep_local = True


register_algorithm(
    "head_first",
    params=BodyHeadParams,
    server=HeadFirstServer,
    client=HeadFirstClient,
    summary="A personal head fitted first each round, then the whole model; bodies averaged (FedPer's split)",
    keeps_client_state=True,  # each client's head, between its rounds
)


if __name__ == "__main__":
    report = rayfed.check("head_first")
    print(report)
    sys.exit(0 if report.ok else 1)
