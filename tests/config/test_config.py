"""RunConfig: validation messages name the field, the value and what is allowed; every field is documented
where help() and the CLI show it; the shipped config files build the papers' protocols."""

from __future__ import annotations

import dataclasses
import json
import pydoc
import re
from pathlib import Path

import pytest

from rayfed import (
    AlgorithmConfig,
    ConfigError,
    DataConfig,
    EngineConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    load_config,
)
from rayfed.cli import build_parser
from rayfed.config.args import config_from_args
from rayfed.util.documented import meaning, section


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
        ("engine.max_workers", -1, "engine.max_workers must be >= 0 (0 = no bound), but got engine.max_workers=-1"),
    ],
)
def test_bad_values_name_field_value_and_rule(path: str, value: object, fragment: str) -> None:
    overrides = {path: value}
    if path.startswith("algorithm.params"):
        overrides["algorithm.name"] = "fedprox"
    with pytest.raises(ConfigError) as err:
        RunConfig().override(overrides)
    assert fragment in str(err.value)


def test_a_bound_on_the_pool_and_a_fixed_pool_are_not_both_set() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig().override({"engine.num_workers": 2, "engine.max_workers": 8})
    assert "engine.max_workers must be 0 while engine.num_workers=2 fixes the pool's size (or set " in str(err.value)
    assert RunConfig().override({"engine.max_workers": 8}).engine.max_workers == 8


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


# --- the shipped protocols (configs/) ----------------------------------------------------------

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "mnist_practical.toml",
            {
                "algorithm.name": "cwfedavg",
                "algorithm.params.wdr_lambda": 10.0,
                "data.dataset": "mnist",
                "data.partition": "dirichlet",
                "data.alpha": 0.1,
                "data.num_clients": 20,
                "data.seed": 1,
                "data.train_fraction": 0.75,
                "model.name": "cnn4",
                "train.batch_size": 10,
                "train.lr": 0.005,
            },
        ),
        (
            "mnist_pathological.toml",
            {
                "algorithm.name": "cwfedavg",
                "algorithm.params.wdr_lambda": 10.0,
                "data.partition": "pathological",
                "data.classes_per_client": 2,
                "data.num_clients": 20,
                "data.seed": 1,
                "train.batch_size": 10,
            },
        ),
        (
            "fedawa_mnist.toml",
            {
                "algorithm.name": "fedawa",
                "algorithm.client": None,
                "train.momentum": 0.9,
                "train.weight_decay": 5e-4,
                "train.batch_size": 50,
                "train.lr": 0.01,
                "data.train_fraction": 0.7,
                "data.num_clients": 20,
            },
        ),
    ],
)
def test_shipped_config_files_build_the_papers_protocols(name: str, expected: dict[str, object]) -> None:
    config = load_config(CONFIGS / name)
    tree = config.to_dict()
    for path, value in expected.items():
        node: object = tree
        for key in path.split("."):
            node = node[key]  # type: ignore[index]
        assert node == value, path


def test_every_shipped_config_file_is_tested() -> None:
    assert sorted(p.name for p in CONFIGS.glob("*.toml")) == [
        "fedawa_mnist.toml",
        "mnist_pathological.toml",
        "mnist_practical.toml",
    ]


def test_every_config_file_the_readme_runs_is_shipped() -> None:
    readme = (CONFIGS.parent / "README.md").read_text()
    files = [line.split()[2] for line in readme.splitlines() if re.match(r"rayfed run \S+\.(toml|yaml|json)\b", line)]
    assert files and all((CONFIGS.parent / name).is_file() for name in files), files


# --- every field documented where help() and the CLI show it -----------------------------------

SECTIONS = [
    (DataConfig, "data."),
    (ModelConfig, "model."),
    (TrainConfig, "train."),
    (AlgorithmConfig, "algorithm."),
    (EngineConfig, "engine."),
    (RunConfig, ""),
]


def _flat(text: str) -> str:
    """Text without pydoc's margins and line breaks."""
    return " ".join(text.replace("|", " ").split())


@pytest.mark.parametrize(("cls", "prefix"), SECTIONS)
def test_help_shows_every_field_with_its_default_and_meaning(cls: type, prefix: str) -> None:
    shown = _flat(pydoc.render_doc(cls, renderer=pydoc.plaintext))
    for field in dataclasses.fields(cls):
        assert f"{prefix}{field.name}" in shown, field.name
        assert _flat(meaning(field)) in shown, field.name
    assert "data.balance = false Pathological partition: equal block sizes" in _flat(
        pydoc.render_doc(DataConfig, renderer=pydoc.plaintext)
    )


def _leaf_fields() -> list[tuple[str, dataclasses.Field]]:
    """(path, field) of every field that holds a value (not a section)."""
    sections = {f.name for f in dataclasses.fields(RunConfig)} - {"seed", "run_dir"}
    return [
        (f"{prefix}{f.name}", f)
        for cls, prefix in SECTIONS
        for f in dataclasses.fields(cls)
        if prefix or f.name not in sections
    ]


def test_rayfed_run_help_lists_every_field_with_its_default_and_meaning(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    shown = _flat(capsys.readouterr().out)
    for path, field in _leaf_fields():
        assert f"{path} = " in shown and _flat(meaning(field)) in shown, path
    assert "train.batch_size = 10 Mini-batch size" in shown
    assert "data.balance = false Pathological partition" in shown


def test_readme_field_table_names_every_field() -> None:
    rows = {
        line.split("|")[1].strip(" `"): line
        for line in (CONFIGS.parent / "README.md").read_text().splitlines()
        if line.startswith(("| `", "| top level"))
    }
    for path, _ in _leaf_fields():
        section_name, _, name = path.rpartition(".")
        assert f"`{name}`" in rows[section_name or "top level"], f"{path} is missing from the README's field table"


def test_a_field_declared_without_a_meaning_is_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Undocumented:
        x: int = 1

    with pytest.raises(TypeError, match="Undocumented.x has no meaning"):
        section("demo")(Undocumented)


# --- flat dotted keys in config files -----------------------------------------------------------


def test_toml_config_file_accepts_flat_dotted_keys_mixed_with_tables(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        '"train.lr" = 0.02\n"algorithm.name" = "cwfedavg"\n"algorithm.params.wdr_lambda" = 100\n'
        "[train]\nrounds = 4\n[data]\nnum_clients = 7\n"
    )
    config = load_config(path)
    assert (config.train.lr, config.train.rounds, config.data.num_clients) == (0.02, 4, 7)
    assert config.algorithm.params.wdr_lambda == 100


def test_yaml_config_file_accepts_flat_dotted_keys_mixed_with_tables(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("train.lr: 0.02\ntrain:\n  rounds: 4\nalgorithm.name: fedprox\nalgorithm:\n  params: {mu: 0.5}\n")
    config = load_config(path)
    assert (config.train.lr, config.train.rounds, config.algorithm.name, config.algorithm.params.mu) == (
        0.02,
        4,
        "fedprox",
        0.5,
    )


def test_config_file_setting_a_field_both_flat_and_in_a_table_is_refused(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('"train.lr" = 0.02\n[train]\nlr = 0.03\n')
    with pytest.raises(ConfigError, match=r"config file .*run.toml' sets train.lr twice"):
        load_config(path)


def test_config_file_with_a_mistyped_dotted_key_suggests_closest(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("train.lrr: 0.02\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'train.lrr'.*did you mean 'lr'"):
        load_config(path)


# --- algorithm.params and algorithm.client --------------------------------------------------------


def test_unknown_algorithm_param_names_the_algorithm_that_takes_it() -> None:
    with pytest.raises(ConfigError) as raised:
        config_from_args(["algorithm.name=fedavg", "algorithm.params.wdr_lambda=10"])
    assert str(raised.value) == (
        "unknown config key 'algorithm.params.wdr_lambda': algorithm.name='fedavg' takes no parameters; "
        "wdr_lambda is a parameter of 'cwfedavg'"
    )


def test_unknown_client_param_names_algorithm_client_and_the_algorithm_that_takes_it() -> None:
    with pytest.raises(
        ConfigError,
        match=r"algorithm.client_params.wdr_lambda': algorithm.client='fedprox' takes "
        r"mu; wdr_lambda is a parameter of 'cwfedavg'",
    ):
        RunConfig().override({"algorithm.client": "fedprox", "algorithm.client_params.wdr_lambda": 1})


def test_mistyped_algorithm_param_suggests_the_closest_of_the_algorithm() -> None:
    with pytest.raises(ConfigError, match=r"algorithm.name='cwfedavg' takes wdr_lambda, .*did you mean 'wdr_lambda'"):
        RunConfig().override({"algorithm.name": "cwfedavg", "algorithm.params.wdr_lamda": 10})


def test_mistyped_algorithm_client_blames_algorithm_client() -> None:
    with pytest.raises(ConfigError) as raised:
        RunConfig().override({"algorithm.name": "fedawa", "algorithm.client": "fedprx"})
    message = str(raised.value)
    assert message.startswith("algorithm.client must be one of")
    assert "but got algorithm.client='fedprx' (did you mean 'fedprox'?)" in message
    assert "algorithm.name" not in message


def test_another_algorithm_starts_from_its_own_default_params(tmp_path) -> None:
    config = load_config(CONFIGS / "fedawa_mnist.toml", {"algorithm.name": "sgdm"})
    assert (config.algorithm.name, config.train.momentum) == ("sgdm", 0.9)
    cw = RunConfig().override({"algorithm.name": "cwfedavg", "algorithm.params.wdr_lambda": 100})
    assert cw.override({"algorithm.name": "cwfedavg"}).algorithm.params.wdr_lambda == 100


def test_a_retired_key_is_refused_with_what_replaced_it(tmp_path) -> None:
    why = r"engine.fold_sums was removed: every run now adds the calls' sums along a fixed tree .* delete the key"
    with pytest.raises(ConfigError, match=why):
        RunConfig().override({"engine.fold_sums": True})
    (tmp_path / "old.toml").write_text("[engine]\nfold_sums = false\n")
    with pytest.raises(ConfigError, match=why):
        load_config(tmp_path / "old.toml")


def test_a_run_saved_with_a_retired_key_resumes_without_it(tmp_path) -> None:
    # Prepare: a one-round run whose config.json carries the key, as runs saved before its removal do.
    from rayfed import run
    from tests.conftest import tiny_overrides

    run_dir = tmp_path / "run"
    run(RunConfig().override(tiny_overrides(run_dir, **{"train.rounds": 1, "engine.checkpoint_every": 1})))
    saved = json.loads((run_dir / "config.json").read_text())
    saved["engine"]["fold_sums"] = False
    (run_dir / "config.json").write_text(json.dumps(saved))
    # Execute: the command line's resume, one more round.
    from rayfed.provenance.resume_config import resumed_config

    resumed = run(resumed_config(str(run_dir), ["train.rounds=2"]), resume=True)
    # Check
    assert resumed.rounds_run == 2
