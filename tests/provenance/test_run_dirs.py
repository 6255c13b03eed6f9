"""Run directories a user can trust: no dead ends, Ctrl-C that says how to continue, clear errors.

Every case: a run that saved no round can be resumed or rerun; input checks
write nothing; Ctrl-C checkpoints the last completed round and prints one line; a run_dir that
cannot be created, a damaged file found on resume and a data.root that is a file are named with
the fix, and a refused resume changes nothing in the run directory.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from rayfed import CheckpointError, ConfigError, DatasetError, ResourceError, RunConfig, run
from rayfed.cli import main
from rayfed.engine.callbacks import Callback, MetricsWriter
from rayfed.engine.interrupts import RunInterrupted, StudyInterrupted
from rayfed.execution.executor import LocalExecutor
from rayfed.provenance.run_identity import MARKER_FILE
from rayfed.tuning import FloatParam, tune
from tests.conftest import tiny_overrides

_RESULTS = ("round", "accuracy", "acc_mean", "acc_std", "test_loss", "train_loss")


_SMALL = {
    "data.options": {"num_samples": 1000},
    "train.batch_size": 25,
    "train.rounds": 3,
    "engine.checkpoint_every": 0,
}


def _config(run_dir: Path, **extra: object) -> RunConfig:
    """3 rounds of 10 clients on 1,000 synthetic samples, in-process, no checkpoint unless told."""
    return RunConfig().override(tiny_overrides(run_dir, **{**_SMALL, **extra}))


def _results(run_dir: Path) -> list[tuple]:
    rows = pq.read_table(run_dir / "rounds.parquet").to_pylist()
    return [tuple(row[key] for key in _RESULTS) for row in rows]


def _snapshot(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()}


class _StopAfter(Callback):
    """Raises ``error`` after round ``last`` is recorded (a Ctrl-C, or a crash)."""

    def __init__(self, last: int, error: type[BaseException] = KeyboardInterrupt) -> None:
        self.last, self.error = last, error

    def after_round(self, run, record, clients) -> bool:
        if record.round == self.last:
            raise self.error
        return False


def _interrupting_after(after_round, last: int):
    """``MetricsWriter.after_round`` that raises KeyboardInterrupt once round ``last`` is written (for the CLI)."""

    def interrupted(self, run, record, clients) -> bool:
        after_round(self, run, record, clients)
        if record.round == last:
            raise KeyboardInterrupt
        return False

    return interrupted


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[tuple]:
    run_dir = tmp_path_factory.mktemp("full") / "run"
    run(_config(run_dir))
    return _results(run_dir)


# --- item 1: no dead-end run directories ----------------------------------------------------------
@pytest.mark.parametrize("resume", [True, False], ids=["--resume", "rerun"])
def test_run_without_a_completed_round_can_be_resumed_or_rerun(tmp_path, uninterrupted, resume) -> None:
    config = _config(tmp_path / "run")
    with pytest.raises(RuntimeError):  # a crash after round 1, before any checkpoint (checkpoint_every=0)
        run(config, callbacks=[_StopAfter(1, RuntimeError)])
    assert not (tmp_path / "run" / "checkpoints").exists() and len(_results(tmp_path / "run")) == 2
    result = run(config, resume=resume)  # starts again from round 0 with the saved partition and config
    assert result.rounds_run == 3 and _results(tmp_path / "run") == uninterrupted
    assert sorted(p.name for p in (tmp_path / "run" / "clients").iterdir()) == [
        f"round_{t:06d}.parquet" for t in range(3)
    ]


def test_both_paths_refuse_another_config_with_the_same_message(tmp_path) -> None:
    config = _config(tmp_path / "run")
    with pytest.raises(RuntimeError):  # config.json and the partition written, no round saved
        run(config, callbacks=[_StopAfter(0, RuntimeError)])
    messages = []
    for resume in (True, False):
        with pytest.raises(ConfigError) as refused:
            run(config.override({"train.lr": 0.5}), resume=resume)
        messages.append(str(refused.value))
    assert messages[0] == messages[1]
    assert "train.lr: " in messages[0] and "-> 0.5" in messages[0]
    assert f"rayfed run --resume {tmp_path / 'run'}" in messages[0]


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"train.batch_size": 10_000}, ConfigError),
        ({"algorithm.name": "cwfedavg", "algorithm.params.classwise_blocks": 7}, ConfigError),
        ({"data.dataset": "mnist", "data.options": {}, "data.root": __file__}, ConfigError),
        pytest.param(
            {"engine.num_gpus_per_worker": 0.25},
            ResourceError,
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU"),
        ),
    ],
    ids=["batch", "cwfedavg-blocks", "data-root", "gpus"],
)
def test_every_input_check_runs_before_anything_is_written(tmp_path, extra, error) -> None:
    with pytest.raises(error):
        run(_config(tmp_path / "run", **extra))
    assert not (tmp_path / "run").exists()


# --- item 2: Ctrl-C ----------------------------------------------------------------------------------
def test_ctrl_c_checkpoints_the_last_round_and_resume_matches_an_uninterrupted_run(tmp_path, uninterrupted) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(RunInterrupted) as stopped:
        run(_config(run_dir), callbacks=[_StopAfter(1)])
    assert stopped.value.saved_round == 1
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["round_000001.npz"]
    assert main(["run", "--quiet", "--resume", str(run_dir)]) == 0
    assert _results(run_dir) == uninterrupted


@pytest.fixture
def ctrl_c_handled() -> Iterator[None]:
    """Python's own Ctrl-C handler, as an interactive run has it: a suite started in the background (``&``)
    inherits SIGINT ignored, and a SIGINT would then never reach the run."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_sigint_while_a_round_changes_state_takes_effect_once_the_round_is_recorded(
    tmp_path, monkeypatch, uninterrupted, ctrl_c_handled
) -> None:
    aggregate = LocalExecutor.aggregate

    def interrupted_aggregate(self, ctx, contributions):
        if ctx.round == 1:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C between the clients' training and the aggregation
        return aggregate(self, ctx, contributions)

    monkeypatch.setattr(LocalExecutor, "aggregate", interrupted_aggregate)
    with pytest.raises(RunInterrupted) as stopped:
        run(_config(tmp_path / "run"))
    assert stopped.value.saved_round == 1
    monkeypatch.undo()
    run(_config(tmp_path / "run"), resume=True)
    assert _results(tmp_path / "run") == uninterrupted


def test_cli_prints_one_line_with_the_saved_round_and_the_resume_command(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(MetricsWriter, "after_round", _interrupting_after(MetricsWriter.after_round, 1))
    run_dir = tmp_path / "run"
    overrides = [f"{k}={v}" for k, v in tiny_overrides(run_dir, **_SMALL).items() if k != "data.options"]
    overrides.append('data.options={"num_samples": 1000}')
    assert main(["run", "--quiet", *overrides]) == 130
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"interrupted: 2 of 3 rounds done, checkpoint of round 1 saved; continue with: rayfed run --resume {run_dir}"
    ]


def test_ctrl_c_in_a_study_names_the_finished_trials_and_the_command(tmp_path, monkeypatch, capsys) -> None:
    base = _config(tmp_path / "unused", **{"train.rounds": 2})
    with pytest.raises(StudyInterrupted) as stopped:
        tune(
            base,
            {"train.lr": FloatParam(0.01, 0.1, log=True)},
            n_trials=3,
            study_name="s",
            study_dir=tmp_path / "study",
            trial_callbacks=lambda trial: [_StopAfter(0)] * (trial.number == 1),
        )
    assert (stopped.value.finished, stopped.value.wanted) == (1, 3)
    assert (tmp_path / "study" / "trial_0001" / "checkpoints" / "round_000000.npz").is_file()

    monkeypatch.setattr(MetricsWriter, "after_round", _interrupting_after(MetricsWriter.after_round, 0))
    space = tmp_path / "lr.yaml"
    space.write_text("train.lr: {type: float, low: 0.01, high: 0.1}\n")
    argv = [
        "tune",
        str(space),
        'data.options={"num_samples": 1000}',
        "train.batch_size=25",
        "train.rounds=2",
        "engine.backend=local",
        "--trials",
        "3",
        "--study-dir",
        str(tmp_path / "study2"),
    ]
    assert main(argv) == 130
    printed = capsys.readouterr()
    assert "Traceback" not in printed.err
    assert printed.out.splitlines() == [
        f"study 'lr' interrupted: 0 of 3 trials finished; resume it with: {shlex.join(['rayfed', *argv])}"
    ]


# --- item 3: clear errors -------------------------------------------------------------------------------
def test_run_dir_whose_parent_is_a_file_is_named_with_the_reason(tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"run_dir='.*/file/run' cannot be created: '.*/file' is a file"):
        run(_config(tmp_path / "file" / "run"))
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize("path", ["/proc/rayfed-test/run", "/sys/rayfed-test/run"])
def test_run_dir_on_a_special_filesystem_is_refused(path) -> None:
    if not Path(path).parts[1:2] or not Path("/" + Path(path).parts[1]).is_dir():
        pytest.skip(f"no {path}")
    with pytest.raises(ConfigError, match=r"cannot be created: '/(proc|sys)' is on the (proc|sysfs) filesystem"):
        run(_config(Path(path)))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders, so chmod cannot make one")
def test_run_dir_in_a_read_only_folder_is_refused(tmp_path) -> None:
    (tmp_path / "ro").mkdir(mode=0o555)
    with pytest.raises(ConfigError, match="is not writable"):
        run(_config(tmp_path / "ro" / "run"))


def test_a_dangling_link_as_run_dir_is_named_as_one_before_anything_is_written(tmp_path) -> None:
    (tmp_path / "run").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"is a symbolic link to '.*nowhere', which does not exist"):
        run(_config(tmp_path / "run"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and not (tmp_path / "nowhere").exists()


def test_a_changed_run_marker_is_blamed_and_not_the_config(tmp_path) -> None:
    # Prepare: a run with a checkpoint, then its marker's identity forged.
    run_dir = tmp_path / "run"
    run(_config(run_dir, **{"train.rounds": 2, "engine.checkpoint_every": 1}))
    marker = json.loads((run_dir / MARKER_FILE).read_text())
    (run_dir / MARKER_FILE).write_text(json.dumps({**marker, "identity": "0" * 64}))
    before = _snapshot(run_dir)

    # Execute
    with pytest.raises(CheckpointError) as refused:
        run(_config(run_dir, **{"train.rounds": 3}), resume=True)

    # Assert: the marker is named as what changed (its seal no longer matches it); nothing is changed.
    message = str(refused.value)
    assert f"its {MARKER_FILE} does not match its seal" in message and "the marker was changed" in message
    assert f"restore {MARKER_FILE} from a copy" in message
    assert "config.json and partition.parquet are not" not in message
    assert _snapshot(run_dir) == before


def _damage(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40])


@pytest.mark.parametrize(
    ("damaged", "error", "fix"),
    [
        ("rounds.parquet", CheckpointError, "start the run again from round 0"),
        ("clients/round_000000.parquet", CheckpointError, "delete it to resume without that round"),
        ("partition.parquet", DatasetError, "delete it to partition the dataset again"),
    ],
)
def test_damaged_file_found_on_resume_is_named_and_nothing_is_changed(tmp_path, damaged, error, fix) -> None:
    run_dir = tmp_path / "run"
    run(_config(run_dir, **{"train.rounds": 2, "engine.checkpoint_every": 1}))
    _damage(run_dir / damaged)
    before = _snapshot(run_dir)
    with pytest.raises(error) as refused:
        run(_config(run_dir, **{"train.rounds": 3}), resume=True)
    assert str(run_dir / damaged) in str(refused.value) and fix in str(refused.value)
    assert _snapshot(run_dir) == before


def test_a_deleted_per_client_table_is_said_on_resume_and_the_run_goes_on(tmp_path, caplog) -> None:
    # Prepare: a run of 2 rounds whose round-0 per-client table was deleted, as the fix of a damaged one says.
    run_dir = tmp_path / "run"
    run(_config(run_dir, **{"train.rounds": 2, "engine.checkpoint_every": 1}))
    (run_dir / "clients" / "round_000000.parquet").unlink()

    # Execute
    with caplog.at_level("WARNING", logger="rayfed"):
        result = run(_config(run_dir, **{"train.rounds": 3}), resume=True)

    # Assert: said once, naming the round; the run ends with every round's summary and the later tables.
    assert f"{run_dir / 'clients'} has no per-client table of round 0: the run continues without it" in caplog.text
    assert result.rounds_run == 3
    assert sorted(p.name for p in (run_dir / "clients").glob("round_*")) == [
        "round_000001.parquet",
        "round_000002.parquet",
    ]


def test_data_root_that_is_a_file_says_so(tmp_path) -> None:
    (tmp_path / "mnist.zip").write_bytes(b"PK")
    with pytest.raises(
        ConfigError,
        match=r"data.root must be a folder, but got data.root='.*mnist.zip', which is a "
        r"file",
    ):
        run(
            _config(
                tmp_path / "run",
                **{"data.dataset": "mnist", "data.options": {}, "data.root": str(tmp_path / "mnist.zip")},
            )
        )
    assert not (tmp_path / "run").exists()
