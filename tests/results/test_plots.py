"""``rayfed plot``: figures from finished runs (tiny in-process runs on the synthetic dataset)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("matplotlib")

from rayfed import RunConfig, run  # noqa: E402
from rayfed.algorithms import ALGORITHMS  # noqa: E402
from rayfed.cli import main  # noqa: E402
from rayfed.data import LABEL_COUNTS_FILE, read_label_counts  # noqa: E402
from rayfed.results.plots import finished_run, load_run, method_label  # noqa: E402
from tests.conftest import tiny_overrides  # noqa: E402

CW_FIGURES = ("p_vs_p_tilde", "norms_local", "norms_global")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One finished cwFedAvg run (Output mode) and one FedAvg run, shared by the tests here."""
    root = tmp_path_factory.mktemp("plots")
    dirs = {"cw": root / "cw", "fedavg": root / "fedavg"}
    small = {"data.options": {"num_samples": 1000}, "train.rounds": 1}
    run(RunConfig().override(tiny_overrides(dirs["cw"], **small, **{"algorithm.name": "cwfedavg"})))
    run(RunConfig().override(tiny_overrides(dirs["fedavg"], **small, **{"algorithm.name": "fedavg"})))
    return dirs


def _pngs(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in out.glob("*.png")}


def test_plot_cwfedavg_run_writes_every_figure(runs, tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["plot", str(runs["cw"]), "--out", str(out)]) == 0
    expected = {"accuracy.png", *(f"cw-{name}.png" for name in CW_FIGURES)}
    written = _pngs(out)
    assert set(written) == expected
    assert all(size > 1000 for size in written.values())
    assert all(png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for png in out.glob("*.png"))
    printed = capsys.readouterr().out
    assert all(str(out / name) in printed for name in expected)
    assert "note:" not in printed


def test_fedavg_run_gets_only_the_curve(runs, tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["plot", str(runs["fedavg"]), str(runs["cw"]), "--out", str(out)]) == 0
    assert set(_pngs(out)) == {"accuracy.png", *(f"cw-{name}.png" for name in CW_FIGURES)}
    printed = capsys.readouterr().out
    assert f"note: {runs['fedavg']}: fedavg run, accuracy curve only" in printed


def test_a_run_without_a_round_draws_nothing_and_says_it_has_no_round_yet(runs, tmp_path, capsys):
    unfinished = tmp_path / "unfinished"
    shutil.copytree(runs["fedavg"], unfinished)
    for path in [unfinished / "rounds.parquet", *(unfinished / "checkpoints").glob("*.npz")]:
        path.unlink()  # as a run stopped before its first round ended leaves it
    out = tmp_path / "figs"

    assert main(["plot", str(unfinished), "--out", str(out)]) == 2

    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"rayfed: error: {str(unfinished)!r} has no round yet (rounds.parquet holds none: its run stopped before its "
        f"first round ended), so there is nothing to draw; continue it (rayfed run --resume {unfinished}), then "
        "plot it"
    )
    assert "checkpoint_every" not in line and not out.exists()
    assert main(["plot", str(unfinished), str(runs["fedavg"]), "--out", str(out)]) == 0
    assert f"note: {unfinished}: no round yet, left out" in capsys.readouterr().out


def test_label_counts_file_matches_the_partition(runs):
    counts, train_counts, input_shape = read_label_counts(runs["cw"] / LABEL_COUNTS_FILE)
    assert counts.shape == train_counts.shape == (10, 10) and input_shape == (1, 28, 28)
    table = pq.read_table(runs["cw"] / "partition.parquet").to_pydict()
    per_client = np.bincount(table["client_id"], minlength=10)
    train = np.bincount([c for c, s in zip(table["client_id"], table["split"]) if s == "train"], minlength=10)
    np.testing.assert_array_equal(counts.sum(axis=1), per_client)
    np.testing.assert_array_equal(train_counts.sum(axis=1), train)
    assert ((counts > 0).sum(axis=1) <= 2).all()  # pathological: 2 classes per client


def test_class_head_norms_read_the_output_weight(runs):
    data = load_run(runs["cw"])
    assert method_label(data.config) == "cwFedAvg (Output)"
    heads = data.server["heads"]  # Output mode: the class-wise part is fc.weight (K x 512) then fc.bias (K)
    expected = np.linalg.norm(heads[:, : 10 * 512].reshape(10, 10, 512).astype(np.float64), axis=-1)
    figures = {f.name: f for f in ALGORITHMS.get("cwfedavg").figures(data.config.algorithm.params, finished_run(data))}
    assert set(figures) == set(CW_FIGURES)
    np.testing.assert_allclose(figures["norms_global"].values, expected)


def test_old_run_without_label_counts_draws_its_curve_and_says_why_not_its_figures(runs, tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(runs["cw"], old)
    (old / LABEL_COUNTS_FILE).unlink()
    out = tmp_path / "figs"
    assert main(["plot", str(old), "--out", str(out)]) == 0
    assert set(_pngs(out)) == {"accuracy.png"}
    note = capsys.readouterr().out
    assert f"no {LABEL_COUNTS_FILE}" in note and "drawing never loads the dataset a run names" in note


def test_missing_matplotlib_says_how_to_install(runs, tmp_path, monkeypatch, capsys):
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import matplotlib...` raise ImportError
    assert main(["plot", str(runs["cw"]), "--out", str(tmp_path / "figs")]) == 2
    assert "pip install 'rayfed[plots]'" in capsys.readouterr().err
    assert not (tmp_path / "figs").exists()


def test_method_labels_name_fedawa_fidelity() -> None:
    from rayfed import RunConfig

    def label(**overrides: object) -> str:
        return method_label(RunConfig().override(overrides))

    assert label(**{"algorithm.name": "fedawa"}) == "FedAWA (code)"
    assert label(**{"algorithm.name": "fedawa_l", "algorithm.params.fidelity": "paper"}) == "FedAWA-L (paper)"
    assert label(**{"algorithm.name": "fedavg"}) == "FedAvg"


def _run(name: str, accuracies: list[float], **overrides: object):
    from rayfed.results.plots import RunData

    config = RunConfig().override({"algorithm.name": "cwfedavg", "run_dir": f"runs/{name}", **overrides})
    rounds = [{"round": t, "accuracy": a} for t, a in enumerate(accuracies)]
    return RunData(Path(name), config, rounds)


def test_only_runs_that_differ_in_the_seed_alone_are_grouped():
    from rayfed.results.plots import curve_groups

    runs = [
        _run("s0", [0.1]),
        _run("s1", [0.2], seed=1),
        _run("lr", [0.3], **{"train.lr": 0.01}),
        _run("lr-s1", [0.3], seed=1, **{"train.lr": 0.01}),
        _run("fedavg", [0.4], **{"algorithm.name": "fedavg"}),
    ]
    groups = curve_groups(runs)
    assert [[run.name for run in g.runs] for g in groups] == [["s0", "s1"], ["lr", "lr-s1"], ["fedavg"]]
    assert [g.legend for g in groups] == [
        "cwFedAvg (Output), train.lr=0.005 (2 seeds)",
        "cwFedAvg (Output), train.lr=0.01 (2 seeds)",
        "FedAvg",
    ]


def test_a_run_that_differs_in_more_than_the_seed_gets_its_own_line():
    from rayfed.results.plots import curve_groups

    groups = curve_groups([_run("a", [0.1]), _run("b", [0.1], seed=3, **{"data.partition": "pathological"})])
    assert [g.legend for g in groups] == [
        "cwFedAvg (Output), data.partition=dirichlet",
        "cwFedAvg (Output), data.partition=pathological",
    ]


def test_rounds_are_counted_as_the_progress_bar_counts_them(runs, tmp_path):
    from rayfed.results.plots import accuracy_points, plot_accuracy_curves

    data = load_run(runs["cw"])
    stored = pq.read_table(runs["cw"] / "rounds.parquet").column("round").to_pylist()
    initial = _run("b", [0.1, 0.2])
    initial.rounds.insert(0, {"round": -1, "accuracy": 0.05})  # engine.eval_initial's row
    assert stored == [0] and accuracy_points(data)[0] == [1]
    assert accuracy_points(initial)[0] == [0, 1, 2]
    assert plot_accuracy_curves([data, initial], tmp_path / "a.png").stat().st_size > 1000


def test_legends_name_only_fields_that_change_numbers_and_fit_the_figure(tmp_path):
    from matplotlib.image import imread

    from rayfed.results.plots import curve_groups, plot_accuracy_curves

    # Prepare: two seeds that differ in where and how often they were checkpointed, and a long-labelled variant.
    runs = [
        _run("a", [0.1, 0.2]),
        _run("b", [0.2, 0.3], seed=1, **{"engine.checkpoint_every": 1, "engine.backend": "local"}),
        _run("c", [0.3, 0.4], **{"algorithm.params": {"variant": "no_wdr", "classwise_layers": ["conv2", "fc"]}}),
    ]
    # Execute
    groups = curve_groups(runs)
    path = plot_accuracy_curves(runs, tmp_path / "a.png")
    # Assert: one line for the two seeds, named without engine fields; the figure grew to hold its legend and
    # the note that explains "(Output)".
    assert [g.legend for g in groups] == ["cwFedAvg (Output) (2 seeds)", "cwFedAvg w/o WDR (conv2+fc)"]
    height, width = imread(path).shape[:2]
    assert height > 4.5 * 120 and width >= 7.5 * 120 * 0.9


def test_accuracy_figure_draws_the_global_model_dashed_where_the_run_has_one(runs, tmp_path):
    from rayfed.results.plots import accuracy_points, plot_accuracy_curves

    # Arrange: cwFedAvg records its global model's accuracy (Eq. 7 with the overall distribution); FedAvg has none.
    cw, fedavg = load_run(runs["cw"]), load_run(runs["fedavg"])
    stored = pq.read_table(runs["cw"] / "rounds.parquet").column("global_accuracy").to_pylist()
    # Act
    global_points = accuracy_points(cw, "global_accuracy")
    path = plot_accuracy_curves([cw, fedavg], tmp_path / "a.png")
    # Assert
    assert global_points == ([1], [100 * stored[0]])
    assert accuracy_points(fedavg, "global_accuracy") == ([], [])
    assert path.stat().st_size > 1000


def test_a_run_with_a_system_model_is_drawn_against_virtual_time_beside_the_rounds(tmp_path):
    from matplotlib.image import imread

    from rayfed.results.plots import plot_accuracy_curves, virtual_time_points

    # Arrange: a run with virtual time (the initial model at 0 s, an unevaluated round left out) and one without
    timed = _run("timed", [0.2, float("nan"), 0.4])
    for row, seconds in zip(timed.rounds, [1800.0, 3600.0, 9000.0]):
        row["virtual_time_s"] = seconds
    timed.rounds.insert(0, {"round": -1, "accuracy": 0.1, "virtual_time_s": 0.0})
    plain = _run("plain", [0.3])
    # Act
    points = virtual_time_points(timed)
    wide = imread(plot_accuracy_curves([timed, plain], tmp_path / "timed.png")).shape[1]
    narrow = imread(plot_accuracy_curves([plain], tmp_path / "plain.png")).shape[1]
    # Assert: hours against %, and a second panel only where a run has virtual time
    assert points == ([0.0, 0.5, 2.5], [10.0, 20.0, 40.0])
    assert virtual_time_points(plain) == ([], [])
    assert wide > 1.5 * narrow


def test_a_private_run_is_drawn_against_the_epsilon_it_spent(tmp_path):
    from matplotlib.image import imread

    from rayfed.results.plots import epsilon_points, plot_accuracy_curves

    # Arrange: a private run (ε 0 for the initial model, growing, an unevaluated round left out) and one without
    private = {"privacy.mechanism": "central", "privacy.delta": 1e-6}
    spent = _run("private", [0.2, float("nan"), 0.4], **private)
    for row, epsilon in zip(spent.rounds, [1.5, 2.0, 3.0]):
        row["epsilon"] = epsilon
    spent.rounds.insert(0, {"round": -1, "accuracy": 0.1, "epsilon": 0.0})
    plain = _run("plain", [0.3])
    # Act
    points = epsilon_points(spent)
    wide = imread(plot_accuracy_curves([spent, plain], tmp_path / "private.png")).shape[1]
    narrow = imread(plot_accuracy_curves([plain], tmp_path / "plain.png")).shape[1]
    # Assert: ε against %, without the initial model's ε = 0, and a second panel only where a run spent ε
    assert points == ([1.5, 3.0], [20.0, 40.0])
    assert epsilon_points(plain) == ([], [])
    assert wide > 1.5 * narrow
