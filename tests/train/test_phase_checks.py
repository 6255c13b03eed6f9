"""The phase contract checks what a method declares: every mistake is one line naming the method, the phase, the
field, the value and the fix, raised before the client trains; and per-client functions stack where they can.

One probe method is registered here, whose client half declares whatever phases a test sets (:data:`PROBE`);
each test runs one worker call of it, sequentially or stacked, as the engine runs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rayfed import RunConfig
from rayfed.algorithms import RoundContext, register_algorithm
from rayfed.algorithms.common.global_model import GlobalModel, GlobalModelClient
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.algorithms.hooks import NoParams
from rayfed.train.job import ClientJob
from rayfed.train.phase import NO_PARAMETERS, Adam, Kept, Phase, Samples, Trainable
from rayfed.util.errors import MethodError
from tests.conftest import runner_and_server

PhasesOf = Callable[[ClientJob], Any]
PROBE: dict[str, PhasesOf] = {}
"""``PROBE["phases"](job)`` is what the probe's client half declares."""


class ProbeClient(GlobalModelClient[NoParams, GlobalModel]):
    """FedAvg's client, declaring the phases a test sets."""

    def phases(self, message: GlobalModel, job: ClientJob) -> Any:
        return PROBE["phases"](job)


register_algorithm("phase_probe", params=NoParams, server=FedAvgServer, client=ProbeClient, summary="test probe")


def _call(phases: PhasesOf, tmp_path: Path, vectorize: str = "off") -> None:
    """One worker call of four clients of the probe, whose client half declares ``phases``."""
    PROBE["phases"] = phases
    config = RunConfig().override(
        {
            "data.options": {"num_samples": 240},
            "data.num_clients": 4,
            "algorithm.name": "phase_probe",
            "engine.backend": "local",
            "engine.vectorize": vectorize,
            "train.batch_size": 8,
        }
    )
    runner, server = runner_and_server(config, tmp_path)
    ctx = RoundContext(round=0, seed=0, lr=config.train.lr, sampled=np.arange(4))
    runner.train(server.broadcast(), ctx, [0, 1, 2, 3])


def _ce_free(out: Any, batch: Any, params: Any, constants: Any) -> torch.Tensor:
    return out.logits.square().mean()


def _per_sample(out: Any, batch: Any, params: Any, constants: Any) -> torch.Tensor:
    return out.logits.square().mean(dim=1)  # one value per sample, not the batch's


MISTAKES: list[tuple[str, PhasesOf, list[str]]] = [
    ("optimizer class", lambda job: [Phase(epochs=1, optimizer=torch.optim.Adam)], ["Phase.optimizer=", "Adam()"]),
    ("optimizer name", lambda job: [Phase(epochs=1, optimizer="adam")], ["Phase.optimizer='adam'", "Adam()"]),
    ("rayfed's class", lambda job: [Phase(epochs=1, optimizer=Adam)], ["Phase.optimizer=", "pass an instance: Adam()"]),
    ("model as a key", lambda job: [Phase(epochs=1, model="personal")], ["Phase.model='personal'", "Kept("]),
    (
        "kept model without state",
        lambda job: [Phase(epochs=1, model=Kept("personal"))],
        ["Phase.model=Kept(", "keeps no client state", "keeps_client_state=True"],
    ),
    ("no epochs", lambda job: [Phase(epochs=0)], ["Phase.epochs=0", ">= 1", "leave a phase out"]),
    ("negative epochs", lambda job: [Phase(epochs=-1)], ["Phase.epochs=-1", ">= 1"]),
    ("fractional epochs", lambda job: [Phase(epochs=1.5)], ["Phase.epochs=1.5", "whole number"]),
    ("no phase", lambda job: [], ["phases() of client 0 returned no phase", "at least one Phase"]),
    ("a bare phase", lambda job: Phase(epochs=1), ["returned Phase(", "not a list of Phase", "[Phase(epochs=1)]"]),
    ("nothing", lambda job: None, ["returned None", "not a list of Phase"]),
    ("not a phase", lambda job: [{"epochs": 1}], ["phase 0 of 1 is {'epochs': 1}", "Phase(epochs=..."]),
    ("no loss at all", lambda job: [Phase(epochs=1, cross_entropy=False)], ["Phase.loss=None", "without a loss"]),
    (
        "views without augmentation",
        lambda job: [Phase(epochs=1, samples=Samples(views=2))],
        ["Phase.samples.views=2", "copies of the same batch", "augment="],
    ),
    (
        "samples as a pair",
        lambda job: [Phase(epochs=1, samples=(job.x_train, job.y_train))],
        ["Phase.samples=(", "Samples("],
    ),
    ("loss per sample", lambda job: [Phase(epochs=1, loss=_per_sample)], ["its loss returned a tensor of shape (8,)"]),
    (
        "a trainable without gradient",
        lambda job: [Phase(epochs=1, trains=NO_PARAMETERS, extra={"s": Trainable(torch.ones(()))})],
        ["Phase.extra=", "nothing gives it a gradient", "on_after_backward"],
    ),
    ("trains nothing", lambda job: [Phase(epochs=1, trains=NO_PARAMETERS)], ["Phase.trains=(0, 0)", "nothing trains"]),
    ("trains off boundaries", lambda job: [Phase(epochs=1, trains=(1, 7))], ["Phase.trains=(1, 7)", "boundaries"]),
    (
        "start as a constant",
        lambda job: [Phase(epochs=1, constants={"start": torch.zeros(3)})],
        ["Phase.constants=['start']", "the loop sets"],
    ),
    ("a hook that is no function", lambda job: [Phase(epochs=1, on_train_end=3)], ["Phase.on_train_end=3"]),
]


@pytest.mark.parametrize(("case", "phases", "words"), MISTAKES, ids=[m[0] for m in MISTAKES])
@pytest.mark.parametrize("vectorize", ["off", "on"])
def test_every_phase_mistake_is_one_line_naming_the_method_the_phase_and_the_field(
    case: str, phases: PhasesOf, words: list[str], vectorize: str, tmp_path: Path
) -> None:
    with pytest.raises(MethodError) as raised:
        _call(phases, tmp_path, vectorize)
    message = str(raised.value)
    assert "\n" not in message and "algorithm 'phase_probe'" in message
    for word in words:
        assert word in message, (word, message)


def _hook_returning(value: Callable[[Any], Any]) -> PhasesOf:
    def edit(params: Any, constants: Any, extra: Any) -> Any:
        return value(params)

    return lambda job: [Phase(epochs=1, on_train_batch_start=edit)]


@pytest.mark.parametrize(
    ("returns", "words"),
    [
        (lambda params: ({0: params[0]}, {}), ["on_train_batch_start returned ({0:", "return a dict"]),  # old arity
        (lambda params: {99: params[0]}, ["edits parameter 99", "the model has"]),
        (lambda params: {0: params[0].reshape(-1)}, ["returned <Tensor of shape", "for 0, whose shape is"]),
        (lambda params: {"s": params[0]}, ["edits 's', which is no Trainable of the phase"]),
    ],
    ids=["arity", "index", "shape", "name"],
)
@pytest.mark.parametrize("vectorize", ["off", "on"])
def test_an_edit_hook_returning_the_wrong_thing_is_named(
    returns: Callable[[Any], Any], words: list[str], vectorize: str, tmp_path: Path
) -> None:
    with pytest.raises(MethodError) as raised:
        _call(_hook_returning(returns), tmp_path, vectorize)
    assert "algorithm 'phase_probe'" in str(raised.value)
    for word in words:
        assert word in str(raised.value)


def test_a_lambda_made_per_client_keeps_stacking_when_it_captures_nothing_per_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def phases(job: ClientJob) -> list[Phase]:
        return [Phase(epochs=1, loss=lambda out, batch, params, constants: 0.1 * params[-1].square().sum())]

    with caplog.at_level(logging.WARNING, logger="rayfed.train.stacking"):
        _call(phases, tmp_path, "on")
    assert not [r for r in caplog.records if "stacks, not one" in r.getMessage()]


def test_a_function_capturing_a_per_client_value_is_named_once_as_the_reason_clients_do_not_stack(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def phases(job: ClientJob) -> list[Phase]:
        scale = torch.tensor(float(job.client_id))
        return [Phase(epochs=1, loss=lambda out, batch, params, constants: scale * params[-1].square().sum())]

    with caplog.at_level(logging.WARNING, logger="rayfed.train.stacking"):
        _call(phases, tmp_path / "a", "on")
        _call(phases, tmp_path / "b", "on")
    said = [r.getMessage() for r in caplog.records if "stacks, not one" in r.getMessage()]
    assert len(said) == 1
    assert "phase 0's loss is a different function for each client" in said[0]
    assert "pass per-client values as constants" in said[0]
