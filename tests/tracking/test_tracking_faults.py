"""Trackers under faults and bad input: a hard kill loses no round, a damaged or lost ``tracking.json`` is named or
rebuilt, a tracker's setting that cannot take a run is refused in one line before anything is written."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")

from rayfed import ConfigError, RunConfig, run  # noqa: E402
from rayfed.cli import main  # noqa: E402
from rayfed.engine.callbacks import Callback  # noqa: E402
from rayfed.tuning import FloatParam, tune  # noqa: E402
from tests.conftest import tiny_overrides  # noqa: E402
from tests.tracking import wandb_reader  # noqa: E402
from tests.tracking.test_tracking import ALL, accuracies, mlflow_run, tensorboard_scalars  # noqa: E402

_KILLED_AFTER = """
import os, signal, sys
from rayfed import run
from rayfed.engine.callbacks import Callback

class KillAfter(Callback):
    def after_round(self, view, record, clients):
        if record.round == {round}:  # the trackers were handed the round just before
            os.kill(os.getpid(), signal.SIGKILL)
        return False

run({overrides!r}, callbacks=[KillAfter()])
"""


_KILLED_BEFORE_RECORDING = """
import os, signal
import rayfed.tracking.callback as callback
from rayfed import run

def write_state(run_dir, state):  # every tool confirmed step {step}; tracking.json would record it now
    if any(entry.step >= {step} for entry in state.values()):
        os.kill(os.getpid(), signal.SIGKILL)
    recorded(run_dir, state)

recorded, callback.write_state = callback.write_state, write_state
run({overrides!r})
"""


@pytest.fixture(autouse=True)
def _offline(monkeypatch) -> None:
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def _each_tracker_holds_every_round_once(run_dir: Path) -> None:
    expected = accuracies(run_dir)
    steps = sorted(expected)
    scalars = tensorboard_scalars(run_dir, "accuracy")
    assert sorted(step for step, _ in scalars) == steps and dict(scalars) == pytest.approx(expected)
    client, logged = mlflow_run(run_dir)  # exactly one MLflow run
    history = client.get_metric_history(logged.info.run_id, "accuracy")
    assert sorted(m.step for m in history) == steps and {m.step: m.value for m in history} == pytest.approx(expected)
    assert logged.data.params["train.lr"] == "0.005"
    rows = wandb_reader.history(run_dir)
    assert len({run_id for run_id, _, _ in rows}) == 1
    assert [step for _, step, _ in rows] == steps
    assert {step: values["accuracy"] for _, step, values in rows} == pytest.approx(expected)
    assert wandb_reader.config(run_dir)["train"]["lr"] == 0.005


@pytest.mark.parametrize(
    ("killer", "recorded"),
    [
        pytest.param(_KILLED_AFTER, 3, id="after tracking.json recorded round 2"),
        pytest.param(_KILLED_BEFORE_RECORDING, 2, id="after the tools confirmed round 2, before tracking.json said so"),
    ],
)
def test_a_driver_killed_while_the_trackers_take_a_round_resumes_with_every_round_in_each_once(
    tmp_path, killer: str, recorded: int
) -> None:
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, **{"engine.loggers": ALL, "train.rounds": 4, "engine.checkpoint_every": 2})
    killed = subprocess.run(
        [sys.executable, "-c", killer.format(round=2, step=3, overrides=overrides)],
        env={**{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}, "WANDB_SILENT": "true"},  # its own
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert {entry["step"] for entry in json.loads((run_dir / "tracking.json").read_text()).values()} == {recorded}

    # from the checkpoint of round 1: round 2 runs again, and is not sent again (each tool's records hold step 3)
    run(overrides, resume=True)

    assert sorted(accuracies(run_dir)) == [1, 2, 3, 4]
    _each_tracker_holds_every_round_once(run_dir)


@pytest.mark.parametrize(
    ("content", "found"),
    [("{not json", "Expecting property name"), ("[]", "JSON list"), ('{"tensorboard": {"step": "three"}}', "three")],
)
def test_a_damaged_tracking_file_is_named_with_its_fix_before_anything_is_written(tmp_path, content, found) -> None:
    overrides = tiny_overrides(tmp_path / "run", **{"engine.loggers": ["tensorboard"], "engine.checkpoint_every": 1})
    run(overrides)
    (tmp_path / "run" / "tracking.json").write_text(content)
    before = {path.name: path.read_bytes() for path in (tmp_path / "run").iterdir() if path.is_file()}

    with pytest.raises(ConfigError, match=rf"tracking.json' cannot be read \(.*{found}.*\); delete it, and the resume"):
        run({**overrides, "train.rounds": 3}, resume=True)

    assert {path.name: path.read_bytes() for path in (tmp_path / "run").iterdir() if path.is_file()} == before


def test_a_lost_tracking_file_is_rebuilt_from_the_trackers_own_records_and_said(tmp_path, caplog) -> None:
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, **{"engine.loggers": ALL, "engine.checkpoint_every": 1})
    run(overrides)
    (run_dir / "tracking.json").unlink()

    with caplog.at_level(logging.WARNING, logger="rayfed.tracking"):
        run({**overrides, "train.rounds": 3}, resume=True)

    assert caplog.text.count("tracking.json is missing") == 3
    assert "own records hold the run's logged run (run_id " in caplog.text and "up to step 2" in caplog.text
    _each_tracker_holds_every_round_once(run_dir)


def test_an_mlflow_store_that_cannot_take_a_run_is_refused_in_one_line_within_seconds(tmp_path, monkeypatch) -> None:
    """Within seconds: one HTTP request to a server (MLflow's own client retries one for minutes), none to a
    store that is no server, counted as they are sent."""
    import requests

    sent: list[str] = []
    send = requests.Session.send
    monkeypatch.setattr(
        requests.Session, "send", lambda self, request, **kw: sent.append(request.url) or send(self, request, **kw)
    )
    cases = {
        "bogus://x": (r"names no store MLflow can use \(.*bogus", []),
        "http://127.0.0.1:9": (
            r"does not answer within 5 s \(ConnectionError\); start its server",
            ["http://127.0.0.1:9/"],
        ),
        "sqlite:////proc/mlflow.db": (r"SQLite cannot write the database there", []),
    }
    for uri, (message, requests_sent) in cases.items():
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        sent.clear()
        with pytest.raises(ConfigError, match=rf"MLFLOW_TRACKING_URI='{uri}'.*{message}.*fix or unset"):
            run(tiny_overrides(tmp_path / "run", **{"engine.loggers": ["mlflow"]}))
        assert sent == requests_sent
        assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=r"MLFLOW_TRACKING_URI='sqlite:////proc/mlflow.db'"):
        base = RunConfig().override(tiny_overrides(tmp_path / "x", **{"engine.loggers": ["mlflow"]}))
        tune(base, {"train.lr": FloatParam(0.01, 0.1)}, n_trials=1, study_dir=tmp_path / "study")
    assert not (tmp_path / "study").exists()


def test_rayfed_tune_with_a_bogus_mlflow_store_prints_one_line(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus://x")
    space = tmp_path / "space.yaml"
    space.write_text("train.lr: {type: float, low: 0.01, high: 0.1}\n")
    study = tmp_path / "study"

    code = main(["tune", str(space), "engine.backend=local", "engine.loggers=mlflow", "--study-dir", str(study)])

    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("rayfed: error: MLFLOW_TRACKING_URI='bogus://x' names no store MLflow can use")
    assert not study.exists()


def test_an_unknown_wandb_mode_is_named_with_the_modes_it_may_take(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "bogus")
    with pytest.raises(ConfigError, match=r"WANDB_MODE='bogus' is not a mode of W&B; set it to one of online, offline"):
        run(tiny_overrides(tmp_path / "run", **{"engine.loggers": ["wandb"]}))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("folder", ["tensorboard", "figures"])
def test_a_trackers_folder_that_is_a_file_refuses_the_resume_before_config_json_changes(tmp_path, folder) -> None:
    overrides = tiny_overrides(tmp_path / "run", **{"engine.checkpoint_every": 1})
    run(overrides)
    (tmp_path / "run" / folder).write_text("not a folder")
    saved = (tmp_path / "run" / "config.json").read_bytes()

    with pytest.raises(ConfigError, match=rf"run/{folder}' is a file, but it is the folder where .*; move it aside"):
        run({**overrides, "train.rounds": 3, "engine.loggers": ["tensorboard"]}, resume=True)

    assert (tmp_path / "run" / "config.json").read_bytes() == saved
    assert run({**overrides, "train.rounds": 3}, resume=True).rounds_run == 3  # a plain resume still goes on


def test_figures_that_cannot_be_drawn_at_the_end_leave_a_finished_run_and_say_what_was_saved(tmp_path, caplog) -> None:
    class FileInTheWay(Callback):
        def after_round(self, view, record, clients):
            (view.run_dir / "figures").write_text("made during the run")
            return False

    with caplog.at_level(logging.WARNING, logger="rayfed.tracking"):
        overrides = tiny_overrides(tmp_path / "run", **{"engine.loggers": ["tensorboard"]})
        result = run(overrides, callbacks=[FileInTheWay()])

    assert result.rounds_run == 2 and (tmp_path / "run" / "summary.json").is_file()
    assert "figures could not be drawn into" in caplog.text and "(it is a file)" in caplog.text
    assert "every round is saved in rounds.parquet" in caplog.text and "--out DIR" in caplog.text


def test_a_disabled_wandb_holds_nothing_so_nothing_counts_as_sent(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run(tiny_overrides(tmp_path / "run", **{"engine.loggers": ["wandb"]}))
    entry = json.loads((tmp_path / "run" / "tracking.json").read_text())["wandb"]
    assert (entry["step"], entry["config"]) == (-1, False)  # a resume with W&B enabled sends every round


@pytest.mark.parametrize("damage", ["an unknown run id", "an unreadable mlflow.db"])
def test_a_resume_whose_logged_run_mlflow_cannot_reopen_names_tracking_json_the_store_and_the_way_on(
    tmp_path, capsys, damage
) -> None:
    run_dir = tmp_path / "run"
    run(tiny_overrides(run_dir, **{"engine.loggers": ["mlflow"], "engine.checkpoint_every": 1, "train.rounds": 1}))
    state = json.loads((run_dir / "tracking.json").read_text())
    if damage == "an unknown run id":
        state["mlflow"]["ids"]["run_id"] = "0" * 32  # a run id the store does not hold
        (run_dir / "tracking.json").write_text(json.dumps(state))
    else:
        (run_dir / "mlflow.db").write_bytes(b"not a database" * 100)

    code = main(["run", "--resume", str(run_dir), "train.rounds=2"])

    printed = capsys.readouterr().err  # MLflow logs its own INFO lines there too
    (error,) = [line for line in printed.splitlines() if line.startswith("rayfed: error: ")]
    assert code == 2 and "Traceback" not in printed and "then start the run again" not in error
    assert f"could not reopen the logged run {{'run_id': '{state['mlflow']['ids']['run_id']}'" in error
    assert f"that {str(run_dir / 'tracking.json')!r} records, in its store 'sqlite:///{run_dir / 'mlflow.db'}'" in error
    assert f"continue without mlflow: rayfed run --resume {run_dir} engine.loggers=[]" in error
