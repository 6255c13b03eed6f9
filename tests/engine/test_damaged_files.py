"""Any damage to any file of a finished run directory is one line, never a traceback, and writes nothing outside
``--out``: a property-based test (Hypothesis) that cuts a file short, fills it with random bytes, gives a value or
a column the wrong type, makes an array claim more than its file holds, or nests JSON deeper than any config, in
``rayfed plot`` and ``load_run`` (the fast lane, on a run written with rayfed's writers) and in ``rayfed run
--resume`` too (the slow lane, on a run of the engine). Its budget and fixed seed are the lane's
(:func:`tests.lanes.hypothesis_profile`)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rayfed
from rayfed.cli import main
from rayfed.results.run_data import load_run
from rayfed.util.errors import RayfedError
from tests.conftest import tiny_overrides
from tests.data.crafted_archive import tree_state
from tests.engine.damage import claim_values, column_of_strings, cut, nest_json, overwrite, written_run

pytest.importorskip("matplotlib")

READ = ("config.json", "summary.json", "rounds.parquet", "label_counts.parquet", "checkpoints/round_000000.npz")
"""The files ``rayfed plot`` and ``load_run`` read of a run (summary.json: none, which must stay so)."""
RESUMED = (*READ, "rayfed-run.json", "partition.parquet", "clients/round_000000.parquet")
"""The files a resume reads besides."""
CAPTURED = settings(suppress_health_check=[*settings().suppress_health_check, HealthCheck.function_scoped_fixture])
"""capsys is shared by a test's examples: each reads out what the one before left first."""
KINDS = ("cut", "random bytes", "wrong type", "huge claim", "deep nesting")


def _damage(path: Path, kind: str, data: st.DataObject) -> None:
    """Damage ``path`` in the way ``kind`` names, drawing its details from ``data``."""
    if kind == "cut":
        cut(path, data.draw(st.floats(0.0, 0.99), label="kept"))
    elif kind == "random bytes":
        overwrite(path, data.draw(st.binary(max_size=512), label="bytes"))
    elif kind == "deep nesting":
        nest_json(path, data.draw(st.sampled_from([65, 1_000, 100_000]), label="depth"))
    elif kind == "huge claim" and path.suffix == ".npz":
        claim_values(path, "server/global", data.draw(st.integers(10**6, 10**15), label="values"))
    elif kind == "huge claim":  # a number longer than Python reads (4,300 digits), or a file beyond the bound
        overwrite(path, b'{"rounds_run": ' + b"9" * data.draw(st.sampled_from([5_000, 17 * 2**20])) + b"}")
    elif path.suffix == ".json":
        _wrong_json(path, data)
    elif path.suffix == ".parquet":
        column_of_strings(path, data.draw(st.sampled_from(pq.read_schema(path).names), label="column"))
    else:  # an array of Python objects where numbers were written
        claim_values(path, "server/global", 1)
        raw = path.read_bytes().replace(b"'<f4'", b"'|O' ")
        path.write_bytes(raw)


def _wrong_json(path: Path, data: st.DataObject) -> None:
    """One value of the JSON file ``path`` (at its top or one level down) replaced by one of another type."""
    tree = json.loads(path.read_text())
    keys = [(key,) for key in tree] + [
        (key, sub) for key, value in tree.items() if isinstance(value, dict) for sub in value
    ]
    where = data.draw(st.sampled_from(keys), label="key")
    value = data.draw(st.sampled_from(["text", 7, -1.5, None, True, [1, "x"], {"x": [{}]}]), label="value")
    holder = tree if len(where) == 1 else tree[where[0]]
    holder[where[-1]] = value
    path.write_text(json.dumps(tree))


def _one_line_or_none(action: Callable[[], object]) -> None:
    """``action`` ends, or raises a RayfedError of one line."""
    try:
        action()
    except RayfedError as error:
        assert "\n" not in str(error), str(error)


def _one_line(code: int, capsys: pytest.CaptureFixture[str]) -> int:
    """``code``, once checked: a command ended (0), or said in one line why it could not (2)."""
    said = capsys.readouterr().err
    error = [line for line in said.splitlines() if not line.startswith(("INFO ", "WARNING "))]  # the log's records
    assert code in (0, 2) and len(error) <= code // 2 and all(e.startswith("rayfed: error: ") for e in error), said
    return code


def _check_readers(
    base: Path, name: str, kind: str, data: st.DataObject, capsys: pytest.CaptureFixture[str], *, resume: bool
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        shutil.copytree(base, run_dir)
        _damage(run_dir / name, kind, data)
        out = Path(folder) / "figures"
        before = tree_state(Path(folder), leave_out=out)
        capsys.readouterr()
        _one_line(main(["plot", str(run_dir), "--out", str(out)]), capsys)
        _one_line_or_none(lambda: load_run(run_dir))
        went_on = resume and _one_line(main(["run", "--resume", str(run_dir), "train.rounds=1"]), capsys) == 0
        after = tree_state(Path(folder), leave_out=out)
        if went_on:  # a resume that went on wrote in its run directory alone
            after, before = (
                {k: v for k, v in tree.items() if k.partition("/")[0] != "run"} for tree in (after, before)
            )
        assert after == before


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return written_run(tmp_path_factory.mktemp("written") / "run")


@CAPTURED
@given(data=st.data(), name=st.sampled_from(READ), kind=st.sampled_from(KINDS))
def test_any_damage_is_one_line_in_plot_and_load_run(
    written: Path, capsys: pytest.CaptureFixture[str], data: st.DataObject, name: str, kind: str
) -> None:
    _check_readers(written, name, kind, data, capsys, resume=False)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    rayfed.run(tiny_overrides(run_dir, **{"train.rounds": 1, "engine.checkpoint_every": 1}))
    return run_dir


@settings(max_examples=min(settings().max_examples, 25), suppress_health_check=CAPTURED.suppress_health_check)
@given(data=st.data(), name=st.sampled_from(RESUMED), kind=st.sampled_from(KINDS))
def test_any_damage_is_one_line_in_plot_load_run_and_resume(
    finished: Path, capsys: pytest.CaptureFixture[str], data: st.DataObject, name: str, kind: str
) -> None:
    _check_readers(finished, name, kind, data, capsys, resume=True)
