"""Optuna studies over rayfed runs: spaces, pruning, parallel trials on Ray, resume, command line."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import pyarrow.parquet as pq
import pytest
from optuna.trial import TrialState

from rayfed import ConfigError, ResourceError, RunConfig, run
from rayfed.cli import main
from rayfed.engine.callbacks import Callback
from rayfed.engine.interrupts import StudyInterrupted
from rayfed.tuning import (
    CategoricalParam,
    FloatParam,
    IntParam,
    SearchSpace,
    attrs,
    finished_trials,
    load_space,
    open_storage,
    recover_interrupted,
    tune,
)
from rayfed.util.processes import process_start_time
from tests.conftest import tiny_overrides
from tests.waiting import wait_for_file, wait_until

REPO = Path(__file__).resolve().parents[2]
LR_SPACE = {"train.lr": FloatParam(0.01, 0.1, log=True)}


def base_config(tmp_path: Path, **extra: object) -> RunConfig:
    """2 rounds, 10 clients, 1,000 synthetic samples, in-process unless told otherwise."""
    small = {"data.options": {"num_samples": 1000}, "train.batch_size": 25, "engine.checkpoint_every": 0, **extra}
    return RunConfig().override(tiny_overrides(tmp_path / "unused", **small))


def rounds_of(trial: optuna.trial.FrozenTrial) -> list[dict]:
    return pq.read_table(Path(trial.user_attrs[attrs.RUN_DIR]) / "rounds.parquet").to_pylist()


# --- search spaces -----------------------------------------------------------------------------


def test_space_files_in_yaml_and_toml_describe_the_same_space(tmp_path) -> None:
    (tmp_path / "space.yaml").write_text(
        "train.lr: {type: float, low: 1.0e-4, high: 0.1, log: true}\n"
        "train.local_epochs: {type: int, low: 1, high: 5}\n"
        "algorithm.params.mu: [0.0, 0.01, 0.1]\n"
    )
    (tmp_path / "space.toml").write_text(  # unquoted dotted keys are nested tables in TOML: both forms work
        'train.lr = { type = "float", low = 1e-4, high = 0.1, log = true }\n'
        '"train.local_epochs" = { type = "int", low = 1, high = 5 }\n'
        '"algorithm.params.mu" = { type = "categorical", choices = [0.0, 0.01, 0.1] }\n'
    )
    yaml_space, toml_space = load_space(tmp_path / "space.yaml"), load_space(tmp_path / "space.toml")
    assert (
        dict(yaml_space)
        == dict(toml_space)
        == {
            "train.lr": FloatParam(1e-4, 0.1, log=True),
            "train.local_epochs": IntParam(1, 5),
            "algorithm.params.mu": CategoricalParam((0.0, 0.01, 0.1)),
        }
    )
    yaml_space.validate(base_config(tmp_path, **{"algorithm.name": "fedprox"}))


FLOAT = {"type": "float", "low": 0.01, "high": 0.1}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"train.lrr": FLOAT}, r"'train.lrr' names no config field \(did you mean 'train.lr'\?\)"),
        ({"lr": [0.01, 0.1]}, r"'lr' names no config field \(did you mean 'train.lr'\?\)"),
        (
            {"algorithm.params.wdr_lambda": [1.0, 10.0]},
            r"'algorithm.params.wdr_lambda' is no param of algorithm.name='fedavg' \(it takes no params\); set "
            r"algorithm.name to one that has it \(cwfedavg\), e.g. algorithm.name=cwfedavg",
        ),
        (
            {"train.local_epochs": {**FLOAT, "low": 1, "high": 5}},
            r"'train.local_epochs'.*float distribution does not fit; use IntParam",
        ),
        ({"algorithm.name": {"type": "int", "low": 1, "high": 5}}, r"'algorithm.name'.*use CategoricalParam"),
        ({"train.lr": {**FLOAT, "low": 0.1}}, r"'train.lr': FloatParam needs low < high, but got low=0.1, high=0.1"),
        ({"train.lr": {**FLOAT, "low": 0, "log": True}}, r"'train.lr': FloatParam with log=True needs low > 0"),
        (
            {"train.lr": {**FLOAT, "low": 0.0}},
            r"'train.lr': the field rejects the value 0.0: train.lr must be a finite number > 0",
        ),
        ({"train.local_epochs": []}, r"'train.local_epochs': CategoricalParam needs at least one choice"),
        (
            {"train.lr": {**FLOAT, "type": "uniform"}},
            r"'train.lr': it has type='uniform'; allowed types: float, int, categorical",
        ),
        ({"train.lr": {"low": 0.01, "high": 0.1}}, r"'train.lr': it has no type; allowed types"),
        (
            {"train.lr": {"type": "float", "low": 0.01, "hi": 0.1}},
            r"'train.lr': a float distribution has no option 'hi' \(did you mean 'high'\?\)",
        ),
        (
            {"train": {"type": "int", "low": 1, "high": 2}},
            r"'train' names a section, not a field; its fields: train.rounds",
        ),
        ({"train.rounds": 5}, r"'train.rounds': it must be a table with type = float \| int \| categorical"),
    ],
)
def test_invalid_space_is_refused_before_any_trial_runs(tmp_path, entry, message) -> None:
    with pytest.raises(ConfigError, match=message):
        tune(base_config(tmp_path), entry, n_trials=2, study_name="bad", study_dir=tmp_path / "study")
    assert not (tmp_path / "study").exists()


def test_cwfedavg_lambda_is_a_searchable_field(tmp_path) -> None:
    base = base_config(tmp_path, **{"algorithm.name": "cwfedavg"})
    SearchSpace({"algorithm.params.wdr_lambda": FloatParam(1, 5000, log=True)}).validate(base)
    with pytest.raises(ConfigError, match="did you mean 'algorithm.params.wdr_lambda'"):
        SearchSpace({"algorithm.params.wdr_lamda": FloatParam(1, 5000, log=True)}).validate(base)


# --- storage ---------------------------------------------------------------------------------


def test_storage_defaults_to_sqlite_in_the_study_dir_and_takes_journal_files(tmp_path) -> None:
    default = open_storage(None, tmp_path / "study")
    journal = open_storage(f"journal://{tmp_path / 'cluster' / 'study.log'}", tmp_path / "unused")
    assert isinstance(default, optuna.storages.RDBStorage) and (tmp_path / "study" / "study.db").exists()
    assert isinstance(journal, optuna.storages.JournalStorage)
    optuna.create_study(storage=journal, study_name="j").enqueue_trial({"x": 1})
    assert (tmp_path / "cluster" / "study.log").stat().st_size > 0
    with pytest.raises(ConfigError, match="storage must be a URL"):
        open_storage("study.db", tmp_path)


def test_pruners_are_chosen_by_registered_name(tmp_path) -> None:
    from rayfed.tuning import PRUNERS, make_pruner

    assert PRUNERS.names() == ["hyperband", "median", "none", "successive_halving"]
    kinds = {name: type(make_pruner(name, rounds=7)).__name__ for name in PRUNERS}
    assert kinds == {
        "hyperband": "HyperbandPruner",
        "median": "MedianPruner",
        "none": "NopPruner",
        "successive_halving": "SuccessiveHalvingPruner",
    }
    with pytest.raises(ConfigError, match=r"unknown pruner pruner='medain' \(did you mean 'median'\?\)"):
        tune(base_config(tmp_path), LR_SPACE, n_trials=1, study_name="p", study_dir=tmp_path / "study", pruner="medain")
    assert not (tmp_path / "study").exists()


# --- studies -----------------------------------------------------------------------------------


def peak_cpus_in_use(ray, stop: threading.Event, peak: list[float]) -> None:
    """Poll the cluster until ``stop`` is set; ``peak[0]`` ends as the most CPUs held at once."""
    total = ray.cluster_resources()["CPU"]
    while not stop.wait(0.02):
        peak[0] = max(peak[0], total - ray.available_resources().get("CPU", 0.0))


def test_parallel_trials_on_ray_overlap_and_match_sequential_runs(tmp_path, ray_cluster) -> None:
    layout = {  # engine.num_workers=0: the two trials share the cluster's two one-CPU workers, one each
        "engine.backend": "ray",
        "engine.num_workers": 0,
        "engine.num_cpus_per_worker": 1,
        "engine.clients_per_call": 5,
    }
    base = base_config(tmp_path, **layout)
    stop, peak = threading.Event(), [0.0]
    poller = threading.Thread(target=peak_cpus_in_use, args=(ray_cluster, stop, peak))
    poller.start()
    try:
        study = tune(
            base, LR_SPACE, n_trials=6, study_name="par", study_dir=tmp_path / "study", pruner="none", parallel_trials=2
        )
    finally:
        stop.set()
        poller.join()
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 6
    assert sorted(p.name for p in (tmp_path / "study").glob("trial_*")) == [f"trial_{i:04d}" for i in range(6)]
    # Really in parallel: the two trials' one-CPU workers held both CPUs at once. A trial whose worker
    # waited for the other's to be released would never take the cluster's second CPU. (Comparing
    # when trials recorded their rounds is no test of this: on a busy 2-core box worker start-up
    # takes most of a 2-round trial, so the rounds of two parallel trials need not interleave.)
    assert peak[0] == 2, f"at most {peak[0]} of 2 CPUs were held at once: the trials did not run together"
    configs = [json.loads((Path(t.user_attrs[attrs.RUN_DIR]) / "config.json").read_text()) for t in trials]
    assert {config["engine"]["num_workers"] for config in configs} == {1}  # an even share each
    for trial in trials[:2]:  # the same trials, one at a time and in-process, give the same rounds
        alone = run(
            base.override(
                {**trial.params, "engine.backend": "local", "run_dir": str(tmp_path / f"alone_{trial.number}")}
            )
        )
        assert alone.accuracies == [r["accuracy"] for r in rounds_of(trial)]
        assert trial.value == alone.best_accuracy


def test_parallel_trials_share_the_clusters_workers_or_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from rayfed.config import EngineConfig
    from rayfed.tuning.parallel import check_cluster_fits, trial_workers

    monkeypatch.setattr("rayfed.actors.cluster.cluster_nodes", lambda: [{"CPU": 8.0}, {"CPU": 3.0}])
    assert trial_workers(EngineConfig(backend="ray"), 3) == {"engine.num_workers": 3}  # 11 workers, 3 trials
    assert trial_workers(EngineConfig(backend="ray", max_workers=4), 2) == {"engine.num_workers": 2}
    assert trial_workers(EngineConfig(backend="ray", num_workers=5), 2) == {}  # set: kept, and checked to fit
    assert trial_workers(EngineConfig(backend="ray"), 1) == {}  # one trial follows the cluster
    with pytest.raises(ResourceError, match=r"parallel_trials=12 .* the Ray cluster holds 11 .* at most 11 trials"):
        trial_workers(EngineConfig(backend="ray"), 12)
    monkeypatch.setattr("ray.cluster_resources", lambda: {"CPU": 11.0})
    with pytest.raises(ResourceError, match=r"parallel_trials=2 x engine.num_workers=6 x 1 CPU per worker needs 12"):
        check_cluster_fits(EngineConfig(backend="ray", num_workers=6), 2)


def test_median_pruner_stops_a_hopeless_trial_after_its_first_round(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path / 'prune.db'}"
    waiting = optuna.create_study(storage=storage, study_name="prune", direction="maximize")
    waiting.enqueue_trial({"train.lr": 0.05})
    waiting.enqueue_trial({"train.lr": 1e-7})  # learns nothing: below the first trial's accuracy from round 0 on
    study = tune(
        base_config(tmp_path),
        {"train.lr": FloatParam(1e-7, 0.1, log=True)},
        n_trials=2,
        study_name="prune",
        study_dir=tmp_path / "study",
        storage=storage,
        pruner=optuna.pruners.MedianPruner(n_startup_trials=1),
    )
    good, hopeless = study.get_trials()
    assert good.state == TrialState.COMPLETE and len(rounds_of(good)) == 2
    assert hopeless.state == TrialState.PRUNED
    assert hopeless.user_attrs[attrs.PRUNED_ROUND] == 0
    assert list(hopeless.intermediate_values) == [0]
    assert len(rounds_of(hopeless)) == 1  # the run stopped at once
    assert json.loads((Path(hopeless.user_attrs[attrs.RUN_DIR]) / "summary.json").read_text())["stopped_early"]


def test_failing_trial_counts_as_finished_and_is_not_retried(tmp_path) -> None:
    space = {"data.options.image_size": [30]}  # the synthetic loader refuses it when the run starts
    study = tune(
        base_config(tmp_path), space, n_trials=1, study_name="fail", study_dir=tmp_path / "study", catch=(ConfigError,)
    )
    (trial,) = study.get_trials()
    assert trial.state == TrialState.FAIL and "image_size" in trial.user_attrs[attrs.ERROR]
    assert recover_interrupted(study) == [] and len(finished_trials(study)) == 1


def test_recover_interrupted_fails_dead_drivers_and_retries_once() -> None:
    study = optuna.create_study(direction="maximize")
    parent = os.getppid()
    live = f"{socket.gethostname()}:{parent}:{process_start_time(parent)}"

    def trial(driver: str, **user: object) -> optuna.Trial:
        t = study.ask()
        t.suggest_float("train.lr", 0.01, 0.1)
        t.set_user_attr(attrs.DRIVER, driver)
        for key, value in user.items():
            t.set_user_attr(key, value)
        return t

    study.tell(trial("gone:1:1"), 0.5)  # 0 complete
    trial(f"{socket.gethostname()}:999999999:1")  # 1 running, its driver is dead
    trial(live)  # 2 running in a live process: left alone
    study.tell(trial("gone:1:1", **{attrs.ERROR: "ValueError: boom"}), state=TrialState.FAIL)  # 3 failed
    study.tell(trial("gone:1:1"), state=TrialState.FAIL)  # 4 interrupted (Ctrl-C)
    study.tell(trial("gone:1:1", **{attrs.RETRY_OF: 7}), state=TrialState.FAIL)  # 5 a retry, interrupted again

    assert recover_interrupted(study) == [1, 4]
    assert recover_interrupted(study) == []  # each interrupted trial is retried once
    states = [t.state for t in study.get_trials()]
    assert states[:6] == [
        TrialState.COMPLETE,
        TrialState.FAIL,
        TrialState.RUNNING,
        TrialState.FAIL,
        TrialState.FAIL,
        TrialState.FAIL,
    ]
    retries = study.get_trials(states=(TrialState.WAITING,))
    assert [t.user_attrs[attrs.RETRY_OF] for t in retries] == [1, 4]
    assert [t.number for t in finished_trials(study)] == [0, 3]


def test_killed_study_resumes_without_repeating_finished_trials(tmp_path) -> None:
    (tmp_path / "space.yaml").write_text("train.lr: {type: float, low: 0.01, high: 0.1, log: true}\n")
    overrides = [
        'data.options={"num_samples": 1000}',
        "train.batch_size=25",
        "data.num_clients=10",
        "data.partition=pathological",
        "train.rounds=2",
        "engine.backend=local",
        "engine.checkpoint_every=0",
    ]
    study_dir = tmp_path / "study"
    command = [
        sys.executable,
        "-m",
        "rayfed",
        "tune",
        str(tmp_path / "space.yaml"),
        *overrides,
        "--trials",
        "4",
        "--study-name",
        "kill",
        "--study-dir",
        str(study_dir),
        "--pruner",
        "none",
        "--no-plots",
    ]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        trial_2 = study_dir / "trial_0002" / "config.json"  # trials 0 and 1 are done
        wait_for_file(trial_2, process, "the study's trial 2", limit_s=90)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    storage = f"sqlite:///{study_dir / 'study.db'}"
    before = optuna.load_study(study_name="kill", storage=storage).get_trials()
    assert [t.state for t in before] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.RUNNING]
    finished_files = {
        t.number: (study_dir / f"trial_{t.number:04d}" / "summary.json").stat().st_mtime_ns for t in before[:2]
    }

    base = base_config(tmp_path, **{"engine.progress": False})
    study = tune(base, tmp_path / "space.yaml", n_trials=4, study_name="kill", study_dir=study_dir, pruner="none")

    after = study.get_trials()
    assert [t.state for t in after] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL] + [TrialState.COMPLETE] * 2
    assert [t.params for t in after[:2]] == [t.params for t in before[:2]]
    assert after[3].user_attrs[attrs.RETRY_OF] == 2 and after[3].params == before[2].params
    assert len(finished_trials(study)) == 4
    for number, mtime in finished_files.items():  # not run again
        assert (study_dir / f"trial_{number:04d}" / "summary.json").stat().st_mtime_ns == mtime
    assert (
        len(
            tune(
                base, tmp_path / "space.yaml", n_trials=4, study_name="kill", study_dir=study_dir, pruner="none"
            ).get_trials()
        )
        == 5
    )  # nothing left to run
    with pytest.raises(ConfigError, match=r"\(train.rounds: 2 -> 3\); only engine.\* may change"):
        tune(
            base.override({"train.rounds": 3}),
            tmp_path / "space.yaml",
            n_trials=5,
            study_name="kill",
            study_dir=study_dir,
        )


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_an_extended_study_samples_new_points(tmp_path, sampler) -> None:
    base = base_config(tmp_path, **{"train.rounds": 1})
    kwargs = {"study_name": "grow", "study_dir": tmp_path / "study", "pruner": "none", "sampler": sampler}
    tune(base, LR_SPACE, n_trials=2, **kwargs)
    study = tune(base, LR_SPACE, n_trials=4, **kwargs)  # a new session: the sampler is made again
    lrs = [t.params["train.lr"] for t in study.get_trials()]
    assert len(lrs) == 4 and len(set(lrs)) == 4, lrs


def test_an_unknown_sampler_is_named(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"sampler must be one of 'tpe', 'random'.*sampler='grid'"):
        tune(base_config(tmp_path), LR_SPACE, n_trials=1, sampler="grid", study_dir=tmp_path / "s")


# --- command line ------------------------------------------------------------------------------


def test_cli_tune_runs_a_study_from_a_yaml_space(tmp_path, capsys) -> None:
    space = tmp_path / "lr.yaml"
    space.write_text("train.lr: {type: float, low: 0.01, high: 0.1, log: true}\n")
    study_dir = tmp_path / "study"
    code = main(
        [
            "tune",
            str(space),
            'data.options={"num_samples": 1000}',
            "train.batch_size=25",
            "data.num_clients=10",
            "train.rounds=2",
            "engine.backend=local",
            "--trials",
            "2",
            "--study-dir",
            str(study_dir),
            "--pruner",
            "median",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert "study 'lr': 2 complete" in out and "train.lr" in out.splitlines()[1]
    # while it ran: a line per round of each trial and one per finished trial, on stderr
    lines = err.splitlines()
    for number in (0, 1):
        assert [line.split(" (")[0] for line in lines if line.startswith(f"trial_000{number}: ")] == [
            f"trial_000{number}: 1/2 round",
            f"trial_000{number}: 2/2 round",
        ]
    ended = [line for line in lines if " complete: " in line]
    assert [line.split(" complete: ")[0] for line in ended] == ["trial_0000", "trial_0001"]
    assert all(" after 2 rounds (train.lr=" in line for line in ended)
    assert ended[0].split("); ")[1].startswith("1 of 2 trials finished, best trial_0000: ")
    assert ended[1].split("); ")[1].startswith("2 of 2 trials finished, best trial_000")
    assert f"optuna-dashboard sqlite:///{study_dir.resolve() / 'study.db'}" in out
    assert (study_dir / "trial_0000" / "rounds.parquet").exists() and (study_dir / "trial_0001").is_dir()
    assert (study_dir / "optimization_history.png").stat().st_size > 0


@pytest.mark.parametrize("place", ["study_dir", "storage"])
def test_a_study_place_that_cannot_be_written_is_one_line_naming_it(tmp_path, capsys, place: str) -> None:
    # Prepare: a file where the study's folder, or the SQLite file's folder, should be.
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    space = tmp_path / "lr.yaml"
    space.write_text("train.lr: {type: float, low: 0.01, high: 0.1}\n")
    where = ["--study-dir", str(blocker / "study")]
    if place == "storage":
        where = ["--study-dir", str(tmp_path / "study"), "--storage", f"sqlite:///{blocker}/study.db"]

    # Execute
    code = main(["tune", str(space), "engine.backend=local", "--trials", "1", *where])

    # Assert: refused with one line that names the place and the fix; the user's file is untouched.
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err and "cannot write the study to" in err
    assert ("--study-dir" in err) and (str(blocker) in err)
    assert blocker.read_text() == "mine"


def test_ctrl_c_between_two_trials_says_nothing_but_the_stop_and_retries_the_trial(tmp_path) -> None:
    # Prepare: Ctrl-C lands in trial 1 before its run starts (while its callbacks are made); what Optuna's
    # trial loop would print is collected where its handlers would get it.
    def interrupt_second(trial: optuna.Trial) -> list:
        if trial.number == 1:
            raise KeyboardInterrupt
        return []

    printed: list[logging.LogRecord] = []
    collector = logging.Handler()
    collector.emit = printed.append  # type: ignore[method-assign]
    optuna_logger = logging.getLogger("optuna.study._optimize")
    optuna_logger.addHandler(collector)

    # Execute
    try:
        with pytest.raises(StudyInterrupted, match="1 of 3 trials finished"):
            tune(
                base_config(tmp_path),
                LR_SPACE,
                n_trials=3,
                study_name="c",
                study_dir=tmp_path / "study",
                trial_callbacks=interrupt_second,
                pruner="none",
            )
    finally:
        optuna_logger.removeHandler(collector)

    # Assert: no warning with a traceback about the stopped trial, which the study retries when it resumes.
    assert not [r for r in printed if r.exc_info is not None], [r.getMessage() for r in printed]
    resumed = tune(base_config(tmp_path), LR_SPACE, n_trials=3, study_name="c", study_dir=tmp_path / "study")
    assert len(finished_trials(resumed)) == 3


def test_a_ctrl_c_that_python_drops_while_the_study_starts_still_stops_it(tmp_path, monkeypatch) -> None:
    # Prepare: Ctrl-C arrives while a __del__ runs as the study starts (Python prints "Exception ignored" and drops
    # the KeyboardInterrupt), before the first trial.
    class Dropping:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGINT)

    def starting(*args: object) -> None:
        Dropping()  # dropped at once: its __del__ runs here

    monkeypatch.setattr("rayfed.tuning.study._mlflow_parent", starting)
    # Execute
    with pytest.raises(StudyInterrupted, match="0 of 2 trials finished"):
        tune(base_config(tmp_path), LR_SPACE, n_trials=2, study_name="d", study_dir=tmp_path / "study", pruner="none")
    # Assert: no trial ran a round
    assert not list((tmp_path / "study").glob("trial_*/rounds.parquet"))


# --- Ctrl-C with parallel trials ---------------------------------------------------------------


def _interrupted_trials_stopped_after_a_round(study_dir: Path, trials: list, rounds: int) -> None:
    """Each trial was stopped by the interruption (FAIL without an error: the resume retries it) after a whole
    round, of which its run holds the metrics and the checkpoint."""
    from rayfed.engine.checkpoint import checkpoint_round, newest_checkpoint

    assert [(t.state, attrs.ERROR in t.user_attrs) for t in trials] == [(TrialState.FAIL, False)] * len(trials)
    for trial in trials:
        recorded = [row["round"] for row in rounds_of(trial)]
        assert 1 <= len(recorded) < rounds, recorded
        assert checkpoint_round(newest_checkpoint(study_dir / f"trial_{trial.number:04d}")) == recorded[-1]


def test_ctrl_c_stops_parallel_trials_after_their_round_and_the_resume_retries_each(tmp_path, capsys) -> None:
    # Prepare: two trials in threads; once both have finished round 0, Ctrl-C reaches the process (the main
    # thread, where Optuna waits for them).
    both_ran_a_round = threading.Barrier(2, timeout=120)

    class CtrlCOnceBothRan(Callback):
        def after_round(self, run, record, clients) -> bool:
            if record.round == 0 and both_ran_a_round.wait() == 0:
                os.kill(os.getpid(), signal.SIGINT)
            return False

    base = base_config(tmp_path, **{"train.rounds": 6})
    kwargs = {"study_name": "par", "study_dir": tmp_path / "study", "pruner": "none", "parallel_trials": 2}

    # Execute
    with pytest.raises(StudyInterrupted, match="0 of 3 trials finished"):
        tune(base, LR_SPACE, n_trials=3, trial_callbacks=lambda trial: [CtrlCOnceBothRan()], **kwargs)

    # Assert: the signal was answered at once with what the study waits for; both trials stopped after a round,
    # as interrupted; the resume retries both and completes the study.
    assert (
        capsys.readouterr()
        .err.splitlines()
        .count(
            "interrupted: waiting for the running trials to end their current round; each is retried when the study "
            "resumes"
        )
        == 1
    )
    stopped = optuna.load_study(study_name="par", storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}").get_trials()
    _interrupted_trials_stopped_after_a_round(tmp_path / "study", stopped, 6)
    resumed = tune(base, LR_SPACE, n_trials=3, **kwargs)
    retries = {t.user_attrs[attrs.RETRY_OF]: t for t in resumed.get_trials() if attrs.RETRY_OF in t.user_attrs}
    assert sorted(retries) == [0, 1] and [t.state for t in retries.values()] == [TrialState.COMPLETE] * 2
    assert [retries[n].params for n in (0, 1)] == [t.params for t in stopped]
    assert len(finished_trials(resumed)) == 3


@pytest.mark.timeout(900)
def test_one_ctrl_c_ends_rayfed_tune_parallel_on_ray_and_a_resume_completes_every_stopped_trial(tmp_path) -> None:
    # Prepare: `rayfed tune --trials 2 --parallel 2` on its private Ray, in a process group of its own as a
    # terminal starts it; Ctrl-C (SIGINT to the whole group, Ray's processes included) once both trials have
    # recorded a round. Optuna has handed out both trials then, and waits for them in its thread pool's shutdown.
    (tmp_path / "space.yaml").write_text("train.lr: {type: float, low: 0.01, high: 0.1, log: true}\n")
    study_dir = tmp_path / "study"
    rounds = 30
    overrides = [
        'data.options={"num_samples": 1000}',
        "train.batch_size=25",
        "data.num_clients=10",
        "data.partition=pathological",
        f"train.rounds={rounds}",
        "engine.checkpoint_every=0",
    ]
    tail = ["--trials", "2", "--parallel", "2", "--study-name", "c", "--study-dir", str(study_dir), "--pruner", "none"]
    command = [sys.executable, "-m", "rayfed", "tune", str(tmp_path / "space.yaml"), *overrides, *tail, "--no-plots"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:

        def both_ran_a_round() -> bool:
            assert process.poll() is None, "rayfed tune ended before both trials ran a round"
            return all((study_dir / f"trial_000{n}" / "rounds.parquet").exists() for n in (0, 1))

        wait_until(both_ran_a_round, "the two trials did not both run a round", limit_s=600)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=300)  # a guard against a hang, not a measure: a round takes ~1 s
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()

    # Assert: one Ctrl-C ended it with the resume line and no traceback; both trials stopped after a round.
    assert process.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "waiting for the running trials to end their current round" in err
    assert "study 'c' interrupted: 0 of 2 trials finished; resume it with: rayfed tune " in out
    stopped = optuna.load_study(study_name="c", storage=f"sqlite:///{study_dir / 'study.db'}").get_trials()
    _interrupted_trials_stopped_after_a_round(study_dir, stopped, rounds)

    # Execute: the resume, in this process (engine.* may change between sessions of a study).
    resumed = tune(
        base_config(tmp_path, **{"train.rounds": rounds}),
        tmp_path / "space.yaml",
        n_trials=2,
        study_name="c",
        study_dir=study_dir,
        pruner="none",
    )

    # Assert: every stopped trial was retried with its parameters, and the study holds its two trials.
    retried = {t.user_attrs[attrs.RETRY_OF]: t for t in resumed.get_trials() if attrs.RETRY_OF in t.user_attrs}
    assert sorted(retried) == [0, 1] and all(t.state == TrialState.COMPLETE for t in retried.values())
    assert [retried[n].params for n in (0, 1)] == [t.params for t in stopped]
    assert len(finished_trials(resumed)) == 2
