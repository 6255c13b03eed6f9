"""A run says once, before it starts, which of its clients train one at a time although ``engine.vectorize``
asks for stacks, and why."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from rayfed.algorithms import resolve
from rayfed.algorithms.declarations import FastPathLimits
from rayfed.config import RunConfig
from rayfed.engine.fast_path import log_slow_paths, slow_paths
from rayfed.engine.problem_build import ShapeOnly

IMAGES = ShapeOnly(input_shape=(3, 32, 32), num_classes=10)


def _config(**overrides: object) -> RunConfig:
    return RunConfig().override({"engine.vectorize": "on", **overrides})


def test_a_model_without_a_stacked_form_is_named_with_its_reason() -> None:
    # Setup
    config = _config(**{"algorithm.name": "fedclassavg", "model.client_models": ["fca_resnet18", "fca_googlenet"]})

    # Execute
    lines = slow_paths(config, resolve(config.algorithm), IMAGES)

    # Assert
    assert lines == [
        "clients of model 'fca_googlenet' train one at a time (engine.vectorize='on' does not apply "
        "to them): its Inception blocks concatenate channels"
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        {"algorithm.name": "fedawa"},  # every registered method stacks
        {"model.name": "fca_googlenet", "engine.vectorize": "off"},  # no stacks asked for
        {"model.name": "fca_googlenet", "engine.vectorize": "auto"},  # auto on a CPU trains one at a time anyway
    ],
    ids=str,
)
def test_nothing_is_said_where_nothing_is_lost(overrides: dict[str, object]) -> None:
    config = _config(**overrides)

    assert slow_paths(config, resolve(config.algorithm), IMAGES) == []


def test_batch_norm_over_padded_batches_is_named_once_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    # Setup: a short last batch would be padded into BatchNorm's statistics
    config = _config(**{"model.name": "resnet20", "train.drop_last": False})

    # Execute
    with caplog.at_level(logging.WARNING, logger="rayfed.engine.fast_path"):
        log_slow_paths(config, resolve(config.algorithm), IMAGES)

    # Assert
    assert len(caplog.records) == 1
    assert "clients of model 'resnet20' train one at a time" in caplog.text
    assert "train.drop_last=false" in caplog.text


def test_an_algorithm_that_declares_it_cannot_stack_is_named_with_its_reason() -> None:
    # Setup: a method registered as one that cannot stack (none of the registered ones is)
    config = _config()
    fedavg = resolve(config.algorithm)
    limited = type(
        "Limited",
        (fedavg.algorithm.client_half, FastPathLimits),
        {"cannot_stack": "its clients draw their batches from one another", "cannot_replay": ""},
    )
    cannot_stack = dataclasses.replace(fedavg.algorithm, client_half=limited)
    algorithm = dataclasses.replace(fedavg, client_algorithm=cannot_stack)

    # Execute
    lines = slow_paths(config, algorithm, IMAGES)

    # Assert
    assert lines == [
        "algorithm 'fedavg' trains its clients one at a time (engine.vectorize='on' does not apply): "
        "its clients draw their batches from one another"
    ]
