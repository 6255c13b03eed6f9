"""Inputs that used to end in a raw traceback or a silent wrong answer: each now says what is wrong, in one
line, with the fix (the cases of run directories and checkpoints are in tests/provenance/test_ownership.py)."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import ConfigError, RunConfig, TrainConfig, run
from rayfed.cli import main
from rayfed.execution.executor import LocalExecutor
from rayfed.util.errors import WorkerError
from tests.conftest import tiny_overrides

_SMALL = {"data.options": {"num_samples": 1000}, "train.batch_size": 25}


def _args(run_dir: Path, **extra: object) -> list[str]:
    """``field=value`` arguments of a tiny run (10 clients, 1,000 synthetic samples, 2 rounds, in-process)."""
    overrides = tiny_overrides(run_dir, **{**_SMALL, **extra})
    return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items()]


def test_a_run_dir_name_longer_than_the_filesystem_allows_is_refused(tmp_path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"cannot be created: the name 'x{20}\.\.\.x{12}' is 300 bytes long and the "
        r"filesystem holds names of at most 255 bytes; choose another run_dir",
    ):
        run(RunConfig().override(tiny_overrides(tmp_path / ("x" * 300))))


def test_a_config_file_that_is_not_utf8_is_named_and_a_bom_is_accepted(tmp_path, capsys) -> None:
    latin = tmp_path / "latin.toml"
    latin.write_bytes("# réglage\n[train]\nrounds = 2\n".encode("latin-1"))
    assert main(["run", str(latin)]) == 2
    err = capsys.readouterr().err
    assert f"config file {str(latin)!r} is not UTF-8 text: byte 0xe9 on line 1" in err and "save it as UTF-8" in err
    with_bom = tmp_path / "bom.yaml"
    with_bom.write_bytes("\ufefftrain.rounds: 3\n".encode())
    from rayfed import load_config

    assert load_config(with_bom).train.rounds == 3


def test_plot_out_naming_a_file_is_refused(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    run(RunConfig().override(tiny_overrides(run_dir, **_SMALL)))
    (tmp_path / "figures.png").write_bytes(b"mine")
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "figures.png")]) == 2
    assert "the figures' folder" in capsys.readouterr().err and (tmp_path / "figures.png").read_bytes() == b"mine"


def test_a_full_disk_names_the_file_and_the_run_resumes_to_the_same_results(tmp_path, monkeypatch, capsys) -> None:
    reference = run(RunConfig().override(tiny_overrides(tmp_path / "ref", **_SMALL, **{"train.rounds": 3})))
    run_dir = tmp_path / "run"
    savez = np.savez

    def disk_full_in_round_1(file, **arrays):
        if str(getattr(file, "name", "")).find("round_000001") >= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return savez(file, **arrays)

    monkeypatch.setattr(np, "savez", disk_full_in_round_1)
    args = _args(run_dir, **{"train.rounds": 3, "engine.checkpoint_every": 1})
    assert main(["run", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"rayfed: error: cannot write {str(run_dir / 'checkpoints' / 'round_000001.npz')!r}: "
        "the disk holding it is full (it needs about "
    )
    assert err.endswith(
        f"free some space, then continue from its checkpoint of round 0 with: rayfed run --resume {run_dir}"
    )
    assert "\n" not in err
    monkeypatch.undo()
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert pq.read_table(run_dir / "rounds.parquet").column("accuracy").to_pylist() == reference.accuracies


def test_a_run_whose_every_update_is_rejected_says_so_and_exits_1(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(["run", *_args(run_dir, **{"train.lr": 1e6, "engine.progress": True})]) == 1
    printed = capsys.readouterr()
    assert "loss=6 of 10 client updates rejected" in printed.err  # the progress line (4 clients take no step)
    assert "done: 2 rounds (2 without a finite training loss: rounds 0, 1)" in printed.out
    assert "rayfed: error: no round produced a finite training loss" in printed.err
    assert "then at the step size (train.lr=1e+06: too large a step diverges)" in printed.err
    assert json.loads((run_dir / "summary.json").read_text())["rounds_without_finite_loss"] == [0, 1]


def test_a_loss_term_that_gives_nan_names_the_method_and_its_loss_before_the_step_size(
    tmp_path, monkeypatch, capsys, caplog
) -> None:
    from rayfed.algorithms.fedprox import FedProxClient

    monkeypatch.setattr(
        FedProxClient, "proximal", lambda self, out, batch, params, constants: out.logits.sum() * math.nan
    )
    args = _args(tmp_path / "run", **{"algorithm.name": "fedprox", "train.lr": 1e-9})

    assert main(["run", *args]) == 1

    (warning,) = [r.getMessage() for r in caplog.records if "so the models did not change" in r.getMessage()]
    assert "rejected (non-finite update (NaN or Inf)), so the models did not change: the local loss of " in warning
    assert "algorithm.name='fedprox' became NaN or infinite: look first at the method's loss terms" in warning
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("rayfed: error: no round produced a finite training loss") and "'fedprox'" in line


def test_the_python_api_takes_a_mapping_of_dotted_fields_and_names_anything_else(tmp_path) -> None:
    result = run(tiny_overrides(tmp_path / "run", **_SMALL))
    assert result.rounds_run == 2 and result.config.data.num_clients == 10
    with pytest.raises(ConfigError, match=r"a run takes a RunConfig, or a mapping .* build one with RunConfig"):
        run(["train.lr=0.1"])  # type: ignore[arg-type]


def test_a_config_field_given_a_string_in_python_is_named_with_the_fix() -> None:
    with pytest.raises(
        ConfigError,
        match=r"train.lr must be a number, but got train.lr='0.01'; give the value "
        r"itself in Python, or give strings to RunConfig\(\).override",
    ):
        TrainConfig(lr="0.01")  # type: ignore[arg-type]
    assert RunConfig().override({"train.lr": "0.01"}).train.lr == 0.01


def test_a_list_of_client_models_on_the_command_line_is_read_as_a_list(capsys) -> None:
    assert main(["run", "model.client_models=[cnn4,nosuchnet]"]) == 2
    err = capsys.readouterr().err
    assert "model.client_models must be one of" in err and "but got model.client_models='nosuchnet'" in err


@pytest.mark.parametrize(("every", "continuation"), [(0, "start it again from round 0"), (1, "continue from")])
def test_a_run_stopped_by_failing_workers_says_how_it_goes_on_from_what_was_saved(
    tmp_path, monkeypatch, capsys, every: int, continuation: str
) -> None:
    # Prepare: from round 1 on, every call of clients fails on every worker it is given.
    train = LocalExecutor.train

    def failing(self, calls, *args, **kwargs):
        if calls.facts.round >= 1:
            raise WorkerError(f"ClientWorker 0 failed (hung) in round {calls.facts.round}.")
        return train(self, calls, *args, **kwargs)

    monkeypatch.setattr(LocalExecutor, "train", failing)
    run_dir = tmp_path / "run"

    # Execute
    code = main(["run", *_args(run_dir, **{"train.rounds": 3, "engine.checkpoint_every": every})])

    # Assert: the real run directory and what it holds, not a placeholder or a checkpoint that is not there.
    err = capsys.readouterr().err.strip()
    assert code != 0 and "\n" not in err and "RUN_DIR" not in err
    saved = "(no checkpoint was saved: engine.checkpoint_every=0)" if every == 0 else "its checkpoint of round 0"
    assert f"The run stopped; after fixing the cause, {continuation}" in err and saved in err
    assert err.endswith(f"with: rayfed run --resume {run_dir}")
