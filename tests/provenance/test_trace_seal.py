"""A run's trace files are sealed with it: a resume whose device table changed is refused with both digests before
anything runs, and goes on once the new digest is accepted, as a changed plugin does."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rayfed import accept_plugins, run
from rayfed.provenance.run_identity import MARKER_FILE
from rayfed.util.errors import PluginError
from tests.conftest import tiny_overrides


def _table(path: Path, slowdown: float) -> str:
    rows = "".join(f"{c},{slowdown if c == 3 else 1.0},10,5\n" for c in range(10))
    path.write_text("client_id,slowdown,download_mbps,upload_mbps\n" + rows)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_resume_whose_device_table_changed_is_refused_with_both_digests_and_accepted_by_the_new_one(
    tmp_path,
) -> None:
    # Prepare: a 2-round run on a device table, which is then edited
    table = tmp_path / "devices.csv"
    sealed = _table(table, 2.0)
    overrides = tiny_overrides(
        tmp_path / "run", **{"system.devices": "trace", "system.device_trace": str(table), "system.step_s": 0.05}
    )
    run(overrides)
    marker = json.loads((tmp_path / "run" / MARKER_FILE).read_text())
    assert marker["traces"] == [{"field": "system.device_trace", "file": str(table.resolve()), "sha256": sealed}]
    changed = _table(table, 9.0)
    rounds = (tmp_path / "run" / "rounds.parquet").read_bytes()
    # Execute: a resume with more rounds
    with pytest.raises(PluginError) as refused:
        run({**overrides, "train.rounds": 3}, resume=True)
    # Assert: one line naming the field, the file, both digests and how to accept; nothing written
    message = str(refused.value)
    assert "\n" not in message and "system.device_trace=" in message and str(table.resolve()) in message
    assert sealed[:16] in message and f"--accept-plugin {changed[:16]}" in message, message
    assert (tmp_path / "run" / "rounds.parquet").read_bytes() == rounds
    # the new digest accepted, the resume runs and the marker records the change and the new trace
    with accept_plugins(changed[:16]):
        run({**overrides, "train.rounds": 3}, resume=True)
    marker = json.loads((tmp_path / "run" / MARKER_FILE).read_text())
    assert [entry["now"] for entry in marker["accepted"]] == [changed]
    assert marker["traces"][0]["sha256"] == changed
    run({**overrides, "train.rounds": 4}, resume=True)  # sealed with the new trace from then on
    assert len(json.loads((tmp_path / "run" / MARKER_FILE).read_text())["accepted"]) == 1
