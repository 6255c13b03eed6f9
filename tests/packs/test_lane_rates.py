"""A learning rate per lane: clients of runs that differ in ``train.lr`` train in one stack to the models each
trains to alone (one lane each, or packed into lanes that take their next client), and a stack whose lanes agree
keeps the one 0-d rate it always had."""

from __future__ import annotations

import pytest
import torch

from rayfed.models import build_model
from rayfed.train.flat import FlatModel
from rayfed.train.phase import Phase
from rayfed.train.stack_layout import sub_layout
from rayfed.train.stacked import lane_rates
from tests.train.test_stacked import SIZES, _jobs, _loop, _prox

RATES = (0.05, 0.2, 0.05, 0.1)


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("phase", [Phase(epochs=2), Phase(epochs=1, loss=_prox)])
def test_each_lane_trains_at_its_own_rate(pack: bool, phase: Phase) -> None:
    torch.manual_seed(0)
    flat = FlatModel(build_model("cnn4", (1, 16, 16), 4))
    starts = torch.stack([flat.vector.detach() + 0.01 * torch.randn(flat.size) for _ in SIZES])
    loop = _loop()
    alone = []
    for index, (job, start) in enumerate(zip(_jobs(flat, momentum=0.9, epochs=2), starts)):
        job.lr = RATES[index]
        flat.load(start)
        loop.train_one(job, [phase])
        alone.append(flat.vector.detach().clone())
    jobs = _jobs(flat, momentum=0.9, epochs=2)
    for job, rate in zip(jobs, RATES):
        job.lr = rate
    stacked = loop.train_stack(jobs, starts, [[phase]] * len(SIZES), pack=pack)
    torch.testing.assert_close(stacked.states, torch.stack(alone), rtol=1e-4, atol=2e-5)


def test_lanes_of_one_rate_keep_one_rate() -> None:
    layout = FlatModel(build_model("cnn4", (1, 16, 16), 4)).layout
    sub = sub_layout(layout, 0, layout.size)
    assert lane_rates([0.1, 0.1, 0.1], sub, torch.device("cpu")).dim() == 0
    rates = lane_rates([0.1, 0.2], sub, torch.device("cpu"))
    views = sub.stacked_views(rates, 2)
    assert all(bool((view[0] == 0.1).all()) and bool((view[1] == 0.2).all()) for view in views)
