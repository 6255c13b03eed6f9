"""A tracker's library that is installed but fails to import (a protobuf clash in ``import mlflow``) refuses the
run or study in one line naming the tracker and the fix, before anything is written. The library is replaced by
one whose import raises as MLflow's does under a protobuf clash, so these tests need no tracker installed."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from rayfed import ConfigError, run
from rayfed.cli import main
from tests.conftest import tiny_overrides

CLASH = (
    "Descriptors cannot be created directly.\n"
    "If this call came from a _pb2.py file, your generated code is out of date and must be regenerated with "
    "protoc >= 3.19.0."
)
"""The first lines of protobuf's error when a package's generated code is older than the protobuf installed."""


class _ClashingLibrary(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``mlflow`` (as an installed package is found) and raises protobuf's error when it is executed."""

    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(name, self) if name == "mlflow" else None

    def exec_module(self, module: ModuleType) -> None:
        raise TypeError(CLASH)


@pytest.fixture
def mlflow_clashes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``import mlflow`` raises protobuf's TypeError; the modules imported before come back afterwards."""
    for name in [n for n in sys.modules if n == "mlflow" or n.startswith("mlflow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "rayfed.tracking.mlflow_tracker", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_ClashingLibrary(), *sys.meta_path])
    yield


def _one_line(message: str) -> None:
    assert "\n" not in message
    assert message.startswith("engine.loggers names 'mlflow', but its package 'mlflow' fails to import (TypeError: ")
    assert "Descriptors cannot be created directly. If this call came from a _pb2.py file" in message
    assert message.endswith("or leave 'mlflow' out of engine.loggers")


def test_a_run_whose_tracker_fails_to_import_is_refused_in_one_line_before_anything_is_written(
    tmp_path, mlflow_clashes
) -> None:
    run_dir = tmp_path / "run"

    with pytest.raises(ConfigError) as refused:
        run(tiny_overrides(run_dir, **{"engine.loggers": ["mlflow"]}))

    _one_line(str(refused.value))
    assert not run_dir.exists()


def test_rayfed_run_and_tune_print_the_one_line(tmp_path, mlflow_clashes, capsys) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("train.lr: {type: float, low: 0.01, high: 0.1}\n")
    tiny = [f"{key}={value}" for key, value in tiny_overrides(tmp_path / "run").items() if key != "data.options"]
    tiny.append("data.options.num_samples=1000")

    ran = main(["run", *tiny, "engine.loggers=mlflow"])
    run_err = capsys.readouterr().err
    tuned = main(["tune", str(space), *tiny, "engine.loggers=mlflow", "--study-dir", str(tmp_path / "study")])
    tune_err = capsys.readouterr().err

    for code, err in ((ran, run_err), (tuned, tune_err)):
        assert code == 2 and "Traceback" not in err
        (line,) = err.strip().splitlines()
        _one_line(line.removeprefix("rayfed: error: "))
    assert not (tmp_path / "run").exists() and not (tmp_path / "study").exists()
