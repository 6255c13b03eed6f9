"""A benchmark writes into the repository's tracked files (benchmarks/results/) only with ``--record``, and then
with the commit it measured; ``--out`` writes elsewhere; without either, nothing is written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import common  # noqa: E402
import compare  # noqa: E402
import reproduce_tables  # noqa: E402
import scaling  # noqa: E402
import throughput  # noqa: E402

SCALING_FILES = ["scaling.json", "scaling.parquet", "scaling.png"]


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """benchmarks/results, moved to a temporary folder for the test."""
    folder = tmp_path / "results"
    monkeypatch.setattr(common, "RESULTS", folder)
    monkeypatch.setattr(scaling, "RESULTS", folder)
    return folder


def _scaling_row(clients: int, *_: object) -> dict[str, float]:
    return {
        "clients": clients,
        "round_s": 0.5,
        "round_s_max": 0.6,
        "server_peak_mb": 100.0,
        "server_start_mb": 90.0,
        "server_state_mb": 1.0,
        "driver_peak_mb": 200.0,
        "setup_s": 1.0,
        "partition": "iid",
        "pool_samples": 15 * clients,
        "accuracy": 0.5,
    }


def test_scaling_writes_nothing_unless_asked(results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scaling, "measure", _scaling_row)
    monkeypatch.setattr(scaling, "private_ray", lambda: _Nothing())
    # Execute: no option, then --out, then --record.
    assert scaling.main(["--populations", "100"]) == 0
    assert not results.exists()
    assert scaling.main(["--populations", "100", "--out", str(tmp_path / "elsewhere")]) == 0
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == SCALING_FILES
    assert not results.exists()
    assert scaling.main(["--populations", "100", "--record"]) == 0
    # Assert: recorded with the commit measured.
    assert sorted(p.name for p in results.iterdir()) == SCALING_FILES
    recorded = json.loads((results / "scaling.json").read_text())
    assert len(recorded["commit"]) == 40 and isinstance(recorded["tree_differs"], bool)


def test_throughput_writes_nothing_unless_asked(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = {"engine_updates_per_s": 60.0, "plain_updates_per_s": 30.0, "two_process_updates_per_s": 63.0}
    monkeypatch.setattr(throughput, "measure", lambda *args: dict(figures))
    assert throughput.main(["--scenarios", "s1", "--rounds", "2"]) == 0
    assert not results.exists()
    assert throughput.main(["--scenarios", "s1", "--rounds", "2", "--record"]) == 0
    recorded = json.loads((results / "throughput.json").read_text())
    assert recorded["results"]["s1"]["limit_ratio"] == pytest.approx(60 / 63)
    assert len(recorded["commit"]) == 40


def test_out_and_record_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        throughput.main(["--record", "--out", "x.json"])


def test_reproduce_tables_records_only_when_asked() -> None:
    assert reproduce_tables.translate(["cwfedavg-mnist"])[-2:] == ["--out", "runs/reproduce"]
    assert reproduce_tables.translate(["cwfedavg-mnist", "--record"])[-2:] == ["--out", "benchmarks/results"]
    old_spelling = ["--table", "fedawa", "--out", "x"]
    assert reproduce_tables.translate(old_spelling) == ["reproduce", "fedawa-mnist", "--out", "x"]


def test_compare_alternates_versions_and_averages_their_last_lines() -> None:
    assert compare.order(3) == ["base", "head", "head", "base", "base", "head"]
    assert compare.summary("throughput_ratio_s1=1.5 limit_ratio_s1=0.9 note=text") == {
        "throughput_ratio_s1": 1.5,
        "limit_ratio_s1": 0.9,
    }
    line = compare.report({"base": [{"x": 1.0}, {"x": 3.0}], "head": [{"x": 3.0}, {"x": 3.0}]})
    assert line == "runs=2 x_base=2.0000 x_head=3.0000 x_head_over_base=1.5000"


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
