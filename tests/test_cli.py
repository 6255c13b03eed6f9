"""The command line: light start-up, discoverable fields, clear argument errors (no run is started here)."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys

import pytest

from rayfed.cli import main
from rayfed.util.seeding import sample_clients

HEAVY = ("torch", "ray", "optuna", "matplotlib")


def test_building_the_command_line_imports_neither_torch_nor_ray():
    code = (
        "import sys, rayfed, rayfed.cli\n"
        "rayfed.cli.build_parser()\n"
        "assert rayfed.cli.main(['run', 'a', 'b']) == 2\n"  # a mistyped argument is answered before the engine loads
        "rayfed.ConfigError, rayfed.RunConfig\n"  # the lazy names that stay light
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_package_names_are_imported_on_first_use():
    import rayfed

    assert rayfed.run.__module__ == "rayfed.tracking.runs"  # the engine's run, with the trackers engine.loggers names
    assert {"run", "RunConfig", "ConfigError"} <= set(rayfed.__all__) <= set(dir(rayfed))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rayfed.nope


def test_run_help_lists_every_field_with_default_and_meaning(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for entry in ("train.lr = 0.005", "engine.join_ratio = 1.0", "algorithm.name =", "data.partition ="):
        assert entry in text
    assert "Fraction of clients sampled each round" in text


def test_list_algorithm_shows_params_defaults_choices_and_meaning(capsys):
    assert main(["list", "cwfedavg"]) == 0
    text = capsys.readouterr().out
    assert "algorithm.params.wdr_lambda = 10.0\n    λ of WDR" in text
    assert 'algorithm.params.fidelity = "code"  (one of "code", "paper")' in text
    assert 'algorithm.params.variant = "wdr"  (one of "wdr", "dist", "no_wdr")' in text
    assert "algorithm.params.classwise_blocks = 1\n    How many of the model's last top-level blocks" in text
    assert "cwFedAvg (Output)" in text


def test_list_algorithm_without_params(capsys):
    assert main(["list", "fedavg"]) == 0
    assert "takes no params" in capsys.readouterr().out


def test_list_unknown_algorithm_suggests_the_closest(capsys):
    assert main(["list", "cwfedav"]) == 2
    assert "did you mean 'cwfedavg'?" in capsys.readouterr().err


def test_every_algorithm_param_has_a_meaning():
    from rayfed.algorithms import ALGORITHMS
    from rayfed.util.documented import meaning

    for name in ALGORITHMS.shipped():  # rayfed's own: a test's plugin need not document its params
        for field in dataclasses.fields(ALGORITHMS.get(name).params_type):
            assert meaning(field), f"{name}: algorithm.params.{field.name}"


@pytest.mark.parametrize(("args", "named"), [(["a", "b"], "a"), (["train.rounds", "7"], "train.rounds")])
def test_an_argument_without_equals_that_is_no_file_is_named(args, named, capsys):
    assert main(["run", *args]) == 2
    assert f"'{named}' is neither a config file nor a field.path=value override" in capsys.readouterr().err


@pytest.mark.parametrize("missing", ["nofile.toml", "configs/nofile"])
def test_a_missing_config_file_is_not_found(missing, capsys):
    assert main(["run", "train.lr=0.1", missing]) == 2
    assert f"rayfed: error: config file '{missing}' not found (looked in " in capsys.readouterr().err


def _one_line_refusal(argv: list[str], capsys) -> str:
    """The single line a refused ``rayfed`` command prints (exit status 2), without its prefix."""
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line.removeprefix("rayfed: error: ")


def test_a_config_folder_given_as_a_config_file_is_called_a_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfgdir").mkdir()
    assert _one_line_refusal(["run", "cfgdir"], capsys) == (
        "'cfgdir' is a folder, not a config file (it holds no config file); give the path of one config file"
    )
    (tmp_path / "cfgdir" / "a.toml").write_text("seed = 1\n")
    assert "(it holds a.toml)" in _one_line_refusal(["run", "cfgdir"], capsys)


def test_an_override_that_names_a_config_file_says_how_to_give_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _one_line_refusal(["run", "a=b.toml"], capsys) == (
        "'a=b.toml' reads as the override a=b.toml, but 'a' is no config field; to run a config file, give its path "
        "alone: rayfed run b.toml"
    )
    (tmp_path / "x=1.toml").write_text("seed = 1\n")
    assert _one_line_refusal(["run", "x=1.toml"], capsys) == (
        "'x=1.toml' is a file, but an argument with '=' is read as a field.path=value override; rename the file "
        "without '='"
    )


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("lr.toml", '[train]\nlr = "0.01"\n', "train.lr is the string '0.01' in the config file, but the field "),
        ("rounds.toml", 'train.rounds = "5"\n', "train.rounds is the string '5' in the config file, but the field "),
        ("lr.yaml", "train:\n  lr: 1e-2\n", "YAML reads an exponent without a dot as a string: write 1.0e-2"),
        ("loggers.toml", 'engine.loggers = "mlflow"\n', "the field takes a list; write it without quotes as [a, b]"),
    ],
)
def test_a_config_file_value_of_the_wrong_type_is_refused_naming_the_field_and_the_type(
    tmp_path, capsys, name, text, expected
):
    (tmp_path / name).write_text(text)
    assert expected in _one_line_refusal(["run", str(tmp_path / name)], capsys)


@pytest.mark.parametrize("name", ["empty.toml", "empty.yaml", "comments.toml"])
def test_an_empty_config_file_is_refused_rather_than_run_on_the_defaults(tmp_path, capsys, name):
    (tmp_path / name).write_text("# nothing set\n" if name.startswith("comments") else "")
    assert _one_line_refusal(["run", str(tmp_path / name), f"run_dir={tmp_path / 'run'}"], capsys) == (
        f"config file {str(tmp_path / name)!r} is empty (it sets no field); write in it the fields to change, or "
        "leave it out to run on the defaults"
    )
    assert not (tmp_path / "run").exists()


def test_a_table_field_given_what_is_no_table_is_refused_in_one_line(capsys):
    assert _one_line_refusal(["run", "data.options={num_samples:600}"], capsys) == (
        'data.options must be a table, e.g. {"key": 1} (JSON on the command line, with its keys in double quotes), '
        "but got data.options='{num_samples:600}'"
    )


def test_resume_takes_no_config_file(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text("seed = 1\n")
    assert main(["run", "--resume", str(tmp_path), str(config)]) == 2
    assert "--resume takes field.path=value overrides only" in capsys.readouterr().err


@pytest.mark.parametrize("same", [True, False])
def test_resume_with_a_run_dir_names_the_conflict_unless_it_is_the_same_folder(tmp_path, capsys, same):
    other = tmp_path / ("" if same else "elsewhere")
    code = main(["run", "--resume", str(tmp_path), f"run_dir={other}"])
    err = capsys.readouterr().err
    if same:  # nothing to resume there: the run_dir override is not what is refused
        assert "holds no run" in err and "names another" not in err
    else:
        assert code == 2 and f"run_dir='{other}' names another" in err and "drop run_dir=" in err


def test_tune_pruner_help_names_every_pruner(capsys):
    pytest.importorskip("optuna")
    from rayfed.tuning.pruning import PRUNERS

    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert all(name in text for name in PRUNERS.names())


def test_a_rounded_join_ratio_warns_once(caplog):
    with caplog.at_level(logging.WARNING, logger="rayfed.util.seeding"):
        for round_index in range(3):
            assert len(sample_clients(0, round_index, 4, 0.01)) == 1
        sample_clients(0, 0, 20, 0.5)  # exactly 10 clients: no warning
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "engine.join_ratio=0.01 of data.num_clients=4 asks for 0.04 clients per round; each round samples 1 "
        "(a join ratio of 0.25)"
    ]


def test_a_reader_that_leaves_early_ends_the_command_quietly() -> None:
    # `rayfed reproduce --list | head -2`: the pipe's reader is gone when rayfed writes; no traceback, status 141
    read_end, write_end = os.pipe()
    os.close(read_end)
    command = [sys.executable, "-m", "rayfed", "reproduce", "--list"]
    done = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, timeout=120)
    os.close(write_end)
    assert done.returncode == 141 and done.stderr == b""
