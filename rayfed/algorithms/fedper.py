"""FedPer: federated averaging of the base layers, personalisation layers kept by each client.

Arivazhagan, Aggarwal, Singh & Choudhary, "Federated Learning with Personalization Layers",
arXiv:1912.00818 (2019). See docs/algorithms.md, FedPer section.

The model is cut into base layers W_B (the body) and personalisation layers W_P (the head,
the last ``head_blocks`` top-level blocks). Each round, client j starts from the server's
W_B and its own W_P,j, runs local SGD on both, and sends W_B only (Algorithm 1):

    W_B ← Σ_j n_j W_B,j / Σ_j n_j        (over the clients that uploaded)

W_P,j never leaves the client (client state store); a client that has not trained yet
holds the common initialisation. Evaluation: W_B with the client's own W_P,j.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfed.algorithms.common.body_head import BodyHeadParams, PartialClient, PartialServer
from rayfed.algorithms.registry import Reporting, register_algorithm
from rayfed.util.documented import section

__all__ = ["FedPerParams", "FedPerServer"]


@section("algorithm.params")
@dataclass(frozen=True)
class FedPerParams(BodyHeadParams):
    """Hyper-parameters of FedPer (``algorithm.params.*``): the personalisation layers.

    The paper varies the number of personalisation layers K_P of its ResNet-34/MobileNet; 1
    (the output layer) is PFLlib's split for small CNNs, and the default here.
    """


class FedPerServer(PartialServer):
    """Averages the body; heads stay with their clients."""

    shared_part = "body"
    keep_local = True


register_algorithm(
    "fedper",
    params=FedPerParams,
    server=FedPerServer,
    client=PartialClient,
    summary="FedPer (Arivazhagan et al. 2019): base layers averaged, personalisation (head) layers kept local",
    keeps_client_state=True,
    reporting=Reporting(label="FedPer"),
)
