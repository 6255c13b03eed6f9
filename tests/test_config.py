"""RunConfig: validation messages name the field, the value and what is allowed."""

from __future__ import annotations

import pytest

from rayfed import ConfigError, RunConfig, load_config
from rayfed.cli_args import config_from_args


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        ("train.lr", 0.0, "train.lr must be a finite number > 0, but got train.lr=0.0"),
        ("train.lr", -1, "train.lr=-1"),
        ("train.rounds", 0, "train.rounds must be >= 1, but got train.rounds=0"),
        ("train.batch_size", 0, "train.batch_size must be >= 1"),
        ("data.alpha", 0, "data.alpha must be a finite number > 0, but got data.alpha=0"),
        ("data.classes_per_client", 0, "data.classes_per_client must be an integer >= 1"),
        ("engine.join_ratio", 0, "engine.join_ratio must be in (0, 1], but got engine.join_ratio=0"),
        ("engine.join_ratio", 1.5, "engine.join_ratio=1.5"),
        ("algorithm.params.mu", -1, "algorithm.params.mu must be a finite number >= 0"),
    ],
)
def test_bad_values_name_field_value_and_rule(path: str, value: object, fragment: str) -> None:
    overrides = {path: value}
    if path.startswith("algorithm.params"):
        overrides["algorithm.name"] = "fedprox"
    with pytest.raises(ConfigError) as err:
        RunConfig().override(overrides)
    assert fragment in str(err.value)


def test_unknown_key_suggests_closest() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'train.lrr'.*did you mean 'lr'"):
        RunConfig.from_dict({"train": {"lrr": 0.1}})


def test_unknown_top_level_key_suggests_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'engine'"):
        RunConfig.from_dict({"engin": {}})


def test_unknown_algorithm_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown algorithm algorithm.name='fedavgg'.*did you mean 'fedavg'.*known"):
        RunConfig().override({"algorithm.name": "fedavgg"})


def test_round_trip_through_dict_is_identity() -> None:
    config = RunConfig().override({"algorithm.name": "fedprox", "algorithm.params.mu": 0.01, "train.lr": 0.1})
    assert RunConfig.from_dict(config.to_dict()) == config
    assert config.algorithm.params.mu == 0.01


def test_string_overrides_are_coerced_to_field_types() -> None:
    config = config_from_args(["train.rounds=7", "train.lr=0.02", "engine.progress=false", "model.client_models=a,b"])
    assert (config.train.rounds, config.train.lr, config.engine.progress) == (7, 0.02, False)
    assert config.model.client_models == ("a", "b")


def test_integer_field_rejects_fraction() -> None:
    with pytest.raises(ConfigError, match="train.rounds must be an integer, but got train.rounds=2.5"):
        RunConfig().override({"train.rounds": 2.5})


def test_toml_file_with_overrides(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('seed = 3\n[train]\nrounds = 4\n[algorithm]\nname = "fedprox"\n[algorithm.params]\nmu = 0.1\n')
    config = load_config(path, {"train.rounds": 9})
    assert (config.seed, config.train.rounds, config.algorithm.params.mu) == (3, 9, 0.1)


def test_config_file_with_unknown_key_suggests_closest(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[data]\nnum_client = 4\n")
    with pytest.raises(ConfigError, match="did you mean 'num_clients'"):
        load_config(path)


def test_client_half_of_another_algorithm() -> None:
    config = RunConfig().override({"algorithm.client": "fedprox", "algorithm.client_params": {"mu": 0.5}})
    assert config.algorithm.client_params.mu == 0.5
