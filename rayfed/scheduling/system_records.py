"""What a run with a system model records of it: virtual time, each client's fate, participation, time to target.

With ``system.devices`` on (docs/system.md), every row of ``rounds.parquet`` gains

* ``virtual_time_s``: the run's virtual time when the round (or asynchronous server step) ended; 0 for the initial
  model's row;
* ``clients_<status>``: how many of the round's clients ended in each :class:`~rayfed.system.status.ClientStatus`
  (``clients_finished``, ``clients_partial``, ``clients_late``, ...);
* ``clients_online`` (a synchronous round): how many clients were online when it sampled;

and every per-client file a ``status`` column (that status, by name, for each client the round sampled or
launched; null for a client only evaluated), beside the columns the round's kind adds (a synchronous round's
``start_s`` and ``finish_s``; an asynchronous one's ``staleness``, and each launch's ``start_s`` and its update's
arrival ``finish_s``). When the run finishes, ``participation.parquet`` counts for
every client how often each status befell it (who the deadline leaves out), and ``summary.json`` records the run's
virtual time and, with ``system.target_accuracy``, the virtual time and round of the first evaluation that reached
it. When the run starts, ``devices.parquet`` and ``availability.parquet`` keep the devices it drew
(:func:`device_tables`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayfed.system.profiles import BYTES_PER_MBIT, DeviceProfiles
from rayfed.system.settings import SystemConfig
from rayfed.system.status import STATUS_NAMES

__all__ = [
    "VIRTUAL_TIME",
    "ONLINE",
    "PARTICIPATION_FILE",
    "DEVICES_FILE",
    "AVAILABILITY_FILE",
    "device_tables",
    "status_counts",
    "with_status",
    "system_summary",
    "participation",
]

VIRTUAL_TIME = "virtual_time_s"
"""The ``rounds.parquet`` column of the run's virtual time after each round."""
ONLINE = "clients_online"
"""The ``rounds.parquet`` column of how many clients were online when a synchronous round sampled."""
PARTICIPATION_FILE = "participation.parquet"
DEVICES_FILE = "devices.parquet"
AVAILABILITY_FILE = "availability.parquet"


def status_counts(status: np.ndarray) -> dict[str, float]:
    """``clients_<status>``: how many of ``status`` (int8 :class:`~rayfed.system.status.ClientStatus`) are each."""
    counts = np.bincount(np.asarray(status, dtype=np.int64), minlength=len(STATUS_NAMES))
    return {f"clients_{name}": float(count) for name, count in zip(STATUS_NAMES, counts)}


def with_status(
    table: pa.Table,
    round_index: int,
    client_ids: np.ndarray,
    status: np.ndarray,
    columns: Mapping[str, np.ndarray | pa.Array] | None = None,
) -> pa.Table:
    """The per-client ``table`` of round ``round_index`` (sorted by ``client_id``) with a row for each of
    ``client_ids`` (sorted; the ones the round did not train get their rows here, ``sampled`` true), their
    ``status`` by name, and ``columns``, one value per client of ``client_ids`` (null in the other rows). A client
    that ``client_ids`` holds twice (an asynchronous client that arrived twice in one step) gets a row for each,
    the table's own columns in the first."""
    base, client_ids = table["client_id"].to_numpy().astype(np.int64), np.asarray(client_ids, np.int64)
    rank = np.arange(len(client_ids)) - np.searchsorted(client_ids, client_ids)  # a repeated client's k-th row
    width = int(rank.max(initial=0)) + 1
    mine = client_ids * width + rank  # (client, k) as one sorted key
    ids, repeat = np.divmod(np.union1d(base * width, mine), width)
    in_base, in_mine = (repeat == 0) & np.isin(ids, base), np.isin(ids * width + repeat, mine)
    rows = pa.array(_positions(base, ids), mask=~in_base, type=pa.int64())
    picks = pa.array(_positions(client_ids, ids) + repeat, mask=~in_mine, type=pa.int64())
    trained = table["sampled"].take(rows).fill_null(False).to_numpy(zero_copy_only=False)
    out = {name: table[name].take(rows) for name in table.column_names}
    out["round"] = pa.array(np.full(len(ids), round_index), pa.int32())
    out["client_id"] = pa.array(ids, pa.int32())
    out["sampled"] = pa.array(in_mine | trained, pa.bool_())
    out["status"] = pa.array(_NAMES[np.asarray(status, np.int64)], pa.string()).take(picks)
    for name, values in (columns or {}).items():
        out[name] = (values if isinstance(values, pa.Array) else pa.array(values)).take(picks)
    return pa.table(out)


_NAMES = np.array(STATUS_NAMES, dtype=object)


def _positions(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Where each of ``ids`` is in ``sorted_ids`` (clipped into range where it is not there)."""
    return np.minimum(np.searchsorted(sorted_ids, ids), max(len(sorted_ids) - 1, 0))


def system_summary(history: Sequence[Mapping[str, Any]], system: SystemConfig) -> dict[str, Any]:
    """``summary.json``'s entries of a run with a system model (none without one): its virtual time, and with
    ``system.target_accuracy`` the virtual time and round (counted from 1) of the first evaluated round whose
    pooled accuracy reached it (null if none did)."""
    if not system.enabled:
        return {}
    rounds = [row for row in history if row["round"] >= 0]
    summary: dict[str, Any] = {VIRTUAL_TIME: float(rounds[-1][VIRTUAL_TIME]) if rounds else 0.0}
    if system.target_accuracy is not None:
        reached = next(
            (row for row in history if _finite(row.get("accuracy")) and row["accuracy"] >= system.target_accuracy),
            None,
        )
        summary["target_accuracy"] = system.target_accuracy
        summary["virtual_time_to_target_s"] = None if reached is None else float(reached[VIRTUAL_TIME])
        summary["rounds_to_target"] = None if reached is None else int(reached["round"]) + 1
    return summary


def _finite(value: Any) -> bool:
    return value is not None and not math.isnan(value)


def participation(run_dir: Path, num_clients: int) -> pa.Table:
    """For every client, how many rounds (or launches) the per-client files record of each status (``sampled``:
    all of them together), read from ``clients/round_*.parquet``."""
    counts = np.zeros((num_clients, len(STATUS_NAMES)), dtype=np.int64)
    for path in sorted((run_dir / "clients").glob("round_*.parquet")):
        table = pq.read_table(path, columns=["client_id", "status"])
        named = table.filter(table["status"].is_valid())
        ids = named["client_id"].to_numpy().astype(np.int64)
        codes = pc.index_in(named["status"], value_set=pa.array(STATUS_NAMES)).to_numpy().astype(np.int64)
        np.add.at(counts, (ids, codes), 1)
    columns = {"client_id": pa.array(np.arange(num_clients), pa.int32()), "sampled": counts.sum(axis=1)}
    columns.update({name: counts[:, index] for index, name in enumerate(STATUS_NAMES)})
    return pa.table(columns)


def device_tables(devices: DeviceProfiles) -> dict[str, pa.Table]:
    """The run's drawn devices as its directory keeps them, in the trace tables' columns (docs/system.md, "Traces"),
    so that one run's devices can be another's ``system.device_trace`` and ``system.availability_trace``:
    ``devices.parquet`` (client_id, slowdown, download_mbps, upload_mbps), and ``availability.parquet`` (client_id,
    start_s, end_s, period_s: one row per online window) unless every client is always online."""
    ids = np.arange(devices.num_clients, dtype=np.int32)
    tables = {
        DEVICES_FILE: pa.table(
            {
                "client_id": ids,
                "slowdown": devices.slowdown,
                "download_mbps": devices.download_bps / BYTES_PER_MBIT,
                "upload_mbps": devices.upload_bps / BYTES_PER_MBIT,
            }
        )
    }
    online = devices.availability
    if not online.always:
        owners = np.repeat(ids, np.diff(online.offsets))
        windows = {"start_s": online.starts, "end_s": online.ends, "period_s": online.periods[owners]}
        tables[AVAILABILITY_FILE] = pa.table({"client_id": owners, **windows})
    return tables
