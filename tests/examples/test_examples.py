"""Every example runs offline in its smallest form, takes ``field.path=value`` overrides as ``rayfed run`` does, and
says in one line what it needs when that is missing (no Ray here: each run uses ``engine.backend=local``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@cache
def _example(name: str) -> ModuleType:
    """The example's module, imported once (a module that registers a dataset must not do it twice)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_example_is_covered_here() -> None:
    covered = {
        "cwfedavg_1000clients",
        "fedclassavg_mnist",
        "motivating_example",
        "optuna_lambda_search",
        "own_method",
        "private_fedavg",
        "private_cwfedavg",
        "system_heterogeneity",
        "system_own_models",
    }
    assert {path.stem for path in EXAMPLES.glob("*.py")} == covered


def test_cwfedavg_1000clients_in_its_smallest_form(tmp_path, capsys) -> None:
    code = _example("cwfedavg_1000clients").main(
        ["--clients", "20", "--rounds", "1", "--epochs", "1", "--run-dir", str(tmp_path / "run"),
         "--record", str(tmp_path / "record.json"),
         'data.options={"num_samples": 1000}', "engine.backend=local", "engine.progress=false"]
    )  # fmt: skip
    result = json.loads(capsys.readouterr().out.split("RESULT ", 1)[1].splitlines()[0])
    assert code == 0 and result["rounds_run"] == 1 and (tmp_path / "run" / "rounds.parquet").is_file()
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["final_accuracy"] == result["final_accuracy"] and record["seconds"] > 0
    assert [r["round"] for r in record["rounds"]] == [0] and record["rounds"][0]["accuracy"] == result["best_accuracy"]


def test_the_readmes_search_space_file_searches_cwfedavgs_lambda_and_lr() -> None:
    from rayfed import RunConfig
    from rayfed.tuning import load_space

    space = load_space(EXAMPLES / "space.yaml")
    space.validate(RunConfig().override({"algorithm.name": "cwfedavg"}))
    assert sorted(space.to_dict()) == ["algorithm.params.wdr_lambda", "train.lr"]


def test_fedclassavg_mnist_offline_and_what_it_needs_without_data(tmp_path, capsys, monkeypatch) -> None:
    example = _example("fedclassavg_mnist")
    common = ["--rounds", "1", "--algorithms", "fedavg", "--partitions", "dir0.5"]
    # Offline, with an override as rayfed run takes it.
    offline = ["--offline", "--num-samples", "400", "--out", str(tmp_path / "offline"), "train.batch_size=4"]
    assert example.main([*offline, *common]) == 0
    assert '"rounds": 1' in capsys.readouterr().out
    # A root without MNIST: one line naming the files and the fix, no traceback.
    assert example.main(["--root", str(tmp_path / "empty"), "--out", str(tmp_path / "mnist"), *common]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedclassavg_mnist.py: error: dataset 'mnist': files missing") and "download" in err
    # No root at all: told the two ways on.
    monkeypatch.delenv("RAYFED_DATA", raising=False)
    with pytest.raises(SystemExit) as stopped:
        example.main(common)
    assert stopped.value.code == 2 and "--offline" in capsys.readouterr().err


def test_system_heterogeneity_in_its_smallest_form(tmp_path, capsys) -> None:
    # Execute: the four runs on 10 clients, 2 a round, 2 rounds (an override as rayfed run takes it)
    code = _example("system_heterogeneity").main(
        ["--out", str(tmp_path), "--clients", "10", "--per-round", "2", "--concurrency", "4", "--rounds", "2",
         "--samples", "1000", "--deadline", "20", "--target", "0.01", "train.batch_size=20"]
    )  # fmt: skip
    # Assert: a line per run with its virtual seconds to the target (every run reaches 1 %), and the figure
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:5]}
    assert code == 0 and sorted(rows) == ["fedavg", "fedavg-deadline", "fedavg-overcommit", "fedbuff"]
    for name, (accuracy, seconds, to_target) in rows.items():
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert float(seconds) == round(summary["virtual_time_s"], 1) and float(accuracy) > 0
        assert float(to_target) == round(summary["virtual_time_to_target_s"], 1)
        assert json.loads((tmp_path / name / "config.json").read_text())["train"]["batch_size"] == 20
    assert lines[5] == f"figure: {tmp_path / 'accuracy.png'}" and (tmp_path / "accuracy.png").stat().st_size > 1000


def test_system_own_models_in_its_smallest_form(tmp_path, capsys) -> None:
    # Execute: 20 clients in two regions, 2 rounds
    code = _example("system_own_models").main(["--out", str(tmp_path / "run"), "--clients", "20", "--rounds", "2"])
    # Assert: a line per round; the devices the run drew are the catalogue's classes
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and lines[0].split() == ["round", "online", "kept", "offline", "virtual", "s"]
    assert [line.split()[0] for line in lines[1:3]] == ["1", "2"]
    assert lines[3].startswith("phone classes drawn (slowdown: clients):")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["system"]["devices"], config["system"]["availability"]) == ("phone_classes", "regional_outages")
    marker = json.loads((tmp_path / "run" / "rayfed-run.json").read_text())  # the models' file, sealed
    assert [Path(p["file"]).name for p in marker["plugins"]] == ["system_own_models.py"]


def test_motivating_example_in_its_smallest_form(capsys) -> None:
    _example("motivating_example").main(["--rounds", "1"])
    assert "FedAvg" in capsys.readouterr().out


def test_optuna_lambda_search_in_its_smallest_form(tmp_path, capsys) -> None:
    code = _example("optuna_lambda_search").main(
        ["--trials", "1", "--parallel", "1", "--rounds", "1", "--samples", "1000", "--study-dir", str(tmp_path),
         "engine.backend=local"]
    )  # fmt: skip
    assert code == 0 and "train.lr" in capsys.readouterr().out and (tmp_path / "study.db").is_file()


def test_own_method_in_its_smallest_form(tmp_path) -> None:
    """The user's method of ``examples/own_method.py`` trains in this process (its Ray run, with the numbers of
    this one, is tests/util/test_plugins.py's)."""
    import rayfed

    example = _example("own_method")
    result = rayfed.run(example.config(1, 0.01, "local", 0, tmp_path / "run"))
    assert result.rounds_run == 1 and 0.0 <= result.final_accuracy <= 1.0
    assert [row["round"] for row in example.rounds(tmp_path / "run")] == [0]


def test_private_fedavg_in_its_smallest_form(tmp_path, capsys) -> None:
    # Execute: FedAvg and Ditto without privacy and at two noise multipliers, 10 clients, 2 rounds
    code = _example("private_fedavg").main(
        ["--out", str(tmp_path), "--methods", "fedavg", "ditto", "--noise", "0.5", "2", "--clients", "10",
         "--per-round", "5", "--rounds", "2", "--samples", "1000"]
    )  # fmt: skip
    # Assert: a line per run, ε falling as the noise grows and infinite without privacy, and the figure
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in lines[1:7]}
    assert code == 0 and sorted(rows) == sorted(f"{m}-{z}" for m in ("fedavg", "ditto") for z in ("off", "z0.5", "z2"))
    for method in ("fedavg", "ditto"):
        assert rows[f"{method}-off"][1] == float("inf") > rows[f"{method}-z0.5"][1] > rows[f"{method}-z2"][1]
    assert (tmp_path / "accuracy_vs_epsilon.png").stat().st_size > 0


@pytest.mark.slow
def test_private_cwfedavg_in_its_smallest_form(tmp_path, capsys, monkeypatch) -> None:
    # Execute: FedAvg, cwFedAvg and FedRep without privacy and at two noise multipliers, 10 clients, 1 round
    example = _example("private_cwfedavg")
    code = example.main(
        ["--offline", "--out", str(tmp_path), "--noise", "0.5", "2", "--clients", "10", "--per-round", "5",
         "--rounds", "1"]
    )  # fmt: skip
    # Assert: a line per run, then the table: ε the same for every method at one z, falling as z grows, and the figure
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and len([line for line in lines if " acc " in line]) == 9
    header = lines.index(next(line for line in lines if line.split()[:2] == ["noise", "epsilon"]))
    assert lines[header].split()[2:] == ["fedavg", "cwfedavg", "fedrep"]
    table = {row.split()[0]: [float(v) for v in row.split()[1:]] for row in lines[header + 1 : header + 4]}
    assert table["off"][0] == float("inf") > table["0.5"][0] > table["2"][0]
    assert (tmp_path / "accuracy_vs_epsilon.png").stat().st_size > 0
    # Without MNIST it says what it needs in one line
    monkeypatch.delenv("RAYFED_DATA", raising=False)
    monkeypatch.delenv("RAYFED_TEST_DATA", raising=False)
    with pytest.raises(SystemExit):
        example.main(["--out", str(tmp_path / "none")])
    assert "MNIST is needed" in capsys.readouterr().err
