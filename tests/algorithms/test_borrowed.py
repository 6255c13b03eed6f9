"""A client half lent to another server half (``algorithm.client``) trains its phases there, or is refused in one
line that names it; it never ends in a bare error from deep inside the method.

Every registered method's client half is lent to FedAvg's server (which sends a plain global model): those whose
phases read nothing of their own message (FedProx's proximal term, Ditto's personal model, FedNH's cosine
classifier on the starting output weight) train; the others say what they lack.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rayfed import RunConfig
from rayfed.algorithms import ALGORITHMS, RoundContext
from rayfed.util.errors import RayfedError
from tests.conftest import runner_and_server

TRAINS_LENT = {"fedprox", "sgdm", "ditto", "feduv", "fednh", "fedavg", "fedrep", "fedbabu", "local"}
"""Client halves whose phases read no message of their own algorithm (a few more may: every one is run)."""


@pytest.mark.parametrize("lent", sorted(ALGORITHMS))
def test_a_client_half_lent_to_fedavg_trains_or_is_refused_naming_it(lent: str, tmp_path: Path) -> None:
    try:
        config = RunConfig().override(
            {
                "data.options": {"num_samples": 240},
                "data.num_clients": 4,
                "algorithm.name": "fedavg",
                "algorithm.client": lent,
                "engine.backend": "local",
                "train.batch_size": 8,
            }
        )
        runner, server = runner_and_server(config, tmp_path)
        ctx = RoundContext(round=0, seed=0, lr=config.train.lr, sampled=np.arange(4))
        result = runner.train(server.broadcast(), ctx, [0, 1, 2, 3])
    except RayfedError as error:  # refused: in one line, naming the lent client half
        assert lent not in TRAINS_LENT, f"{lent}'s phases should train under FedAvg: {error}"
        assert "\n" not in str(error) and repr(lent) in str(error), str(error)
        return
    assert all(math.isfinite(report.train_loss) and report.steps > 0 for report in result.reports)
