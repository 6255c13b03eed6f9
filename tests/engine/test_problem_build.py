"""The common initial model: drawn from its own stream of the run seed, or where the cwFedAvg authors' code draws it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfed import ConfigError, RunConfig
from rayfed.data import load_dataset
from rayfed.engine.problem_build import build_problem
from rayfed.models import build_model
from rayfed.train.flat import FlatModel


def test_torch_seed_init_is_the_model_built_right_after_torch_manual_seed() -> None:
    # Prepare: the authors' code calls torch.manual_seed(args.seed) and then builds the model.
    data = load_dataset("synthetic", None, options={"num_samples": 20})
    torch.manual_seed(3)
    expected = FlatModel(build_model("cnn4", data.input_shape, data.num_classes)).state_numpy()
    # Execute
    _, seeded = build_problem(RunConfig().override({"seed": 3, "model.init": "torch_seed"}), data)
    _, derived = build_problem(RunConfig().override({"seed": 3}), data)
    # Assert: the same parameters, bit for bit; the default stream gives another draw of the same seed.
    np.testing.assert_array_equal(seeded["cnn4"], expected)
    assert not np.array_equal(derived["cnn4"], expected)
    with pytest.raises(ConfigError, match="model.init"):
        RunConfig().override({"model.init": "torch"})
