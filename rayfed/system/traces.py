"""Device and availability traces read from files: FedScale's two pickled formats, or a plain table per client.

FedScale ships its traces as pickled dicts keyed by client (its "Device Trace File Formats")::

    device capacity:  {client: {'computation': ms per sample, 'communication': kbit/s}}
    client behaviour: {client: {'active': [s, ...], 'inactive': [s, ...], 'finish_time': s, 'duration': s,
                                'model': str}}

A pickle can run any code when loaded, so these are read by :class:`PlainDataUnpickler`, whose ``find_class``
refuses every class and function: what loads is made only of dicts, lists, numbers and strings, and anything
else is refused in one line before any of it is used. The run's clients take the trace's entries in the order
of their keys (client 0 the smallest key); a trace with fewer entries than the run has clients is refused.

A table (``.csv`` or ``.parquet``) names the clients by ``client_id`` 0 … M-1, every one of them present:

    devices:      client_id, slowdown, download_mbps, upload_mbps   (one row per client)
    availability: client_id, start_s, end_s, period_s               (one row per online window)
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from rayfed.system.availability import Availability
from rayfed.system.checks import refuse_not_positive
from rayfed.util.errors import ConfigError

__all__ = [
    "PlainDataUnpickler",
    "read_plain_pickle",
    "fedscale_devices",
    "fedscale_availability",
    "table_devices",
    "table_availability",
    "DeviceColumns",
    "is_table",
]

TABLE_SUFFIXES = (".csv", ".parquet")
"""The endings of a table trace; any other file is read as FedScale's pickled format."""
DeviceColumns = tuple[np.ndarray, np.ndarray, np.ndarray]
"""(slowdown, download bytes/s, upload bytes/s), one value per client."""
_PLAIN = (dict, list, int, float, str)
_PICKLE_START = b"\x80"
"""The first byte of a pickle of protocol 2 or later (pickle's PROTO opcode)."""


class PlainDataUnpickler(pickle.Unpickler):
    """An unpickler that builds dicts, lists, numbers and strings and nothing else: every class or function a
    pickle names (which a general unpickler would import and call) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it holds a pickled {module}.{name}, not plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds a persistent reference, not plain data")


def read_plain_pickle(path: str, field: str) -> Any:
    """The plain data pickled in ``path`` (dicts, lists, numbers and strings); ConfigError naming ``field`` and
    the file for anything else (a class instance, a tuple, bytes, a file that is not a pickle)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(
            f"{field}={path!r} cannot be read ({error.strerror or error}); give a readable file"
        ) from None
    if not raw.startswith(_PICKLE_START):
        raise ConfigError(
            f"{field}={path!r} is not a pickle (it starts with {raw[:12]!r}, where FedScale's pickled traces, protocol "
            f"2 or later, start with {_PICKLE_START!r}): name a table {' or '.join(TABLE_SUFFIXES)}, or give "
            "FedScale's pickled file (docs/system.md)"
        )
    try:
        data = PlainDataUnpickler(io.BytesIO(raw)).load()
    except Exception as error:  # any corrupt or foreign pickle raises, and nothing in it has run
        raise ConfigError(
            f"{field}={path!r} is refused: {error}; rayfed reads a pickled trace as plain data only (dicts, "
            "lists, numbers, strings) and never runs what a pickle names: convert it to plain Python values or to "
            "a .csv table (docs/system.md)"
        ) from None
    _check_plain(data, field, path)
    return data


def _check_plain(data: Any, field: str, path: str) -> None:
    """Refuse anything but dicts, lists, numbers and strings (a pickle builds tuples, sets, bytes and None without
    naming a class). Each dict or list is looked into once, so a pickle that shares one many times, or holds
    itself, is checked in one pass over what it holds."""
    stack, seen = [data], set()
    while stack:
        item = stack.pop()
        if isinstance(item, (dict, list)):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if not isinstance(item, _PLAIN):
            raise ConfigError(
                f"{field}={path!r} is refused: it holds a {type(item).__name__}, not plain data (dicts, lists, "
                "numbers, strings); convert it to plain Python values or to a .csv table (docs/system.md)"
            )
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _entries(data: Any, num_clients: int, field: str, path: str) -> list[Any]:
    """The trace's entries in the order of their keys (client c takes the c-th), at least ``num_clients`` of them."""
    if not isinstance(data, dict):
        raise ConfigError(f"{field}={path!r} holds a {type(data).__name__}, not a dict of clients (FedScale's format)")
    if len(data) < num_clients:
        raise ConfigError(
            f"{field}={path!r} holds {len(data)} clients, but the run has {num_clients} (data.num_clients): a trace "
            "gives every client its own entry; use a trace with as many clients, or fewer clients"
        )
    try:
        keys = sorted(data)
    except TypeError:
        raise ConfigError(
            f"{field}={path!r}: its client keys mix numbers and strings; key every client alike"
        ) from None
    return [data[key] for key in keys]


def _number(entry: Any, key: str, client: int, field: str, path: str) -> float:
    value = entry.get(key) if isinstance(entry, Mapping) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value) or value <= 0:
        raise ConfigError(
            f"{field}={path!r}: client {client}'s {key!r} is {value!r}; it must be a finite number > 0 "
            "(speeds and bandwidths are positive)"
        )
    return float(value)


def fedscale_devices(path: str, num_clients: int) -> DeviceColumns:
    """A FedScale device capacity trace: the slowdown is a device's ``computation`` (its time per sample) over
    the trace's median one, so the median device is the reference device; ``communication`` (kbit/s) is the
    bandwidth both ways, as FedScale uses it."""
    field = "system.device_trace"
    entries = _entries(read_plain_pickle(path, field), num_clients, field, path)
    compute = np.array([_number(entry, "computation", c, field, path) for c, entry in enumerate(entries)])
    bandwidth = np.array([_number(e, "communication", c, field, path) for c, e in enumerate(entries[:num_clients])])
    bandwidth *= 1000 / 8  # kbit/s to bytes/s
    return compute[:num_clients] / np.median(compute), bandwidth, bandwidth.copy()


def fedscale_availability(path: str, num_clients: int) -> Availability:
    """A FedScale client behaviour trace: client c is online in ``[active[k], inactive[k])`` of every
    ``finish_time`` seconds."""
    field = "system.availability_trace"
    entries = _entries(read_plain_pickle(path, field), num_clients, field, path)[:num_clients]
    clients: list[int] = []
    starts: list[float] = []
    ends: list[float] = []
    periods = np.empty(num_clients)
    for client, entry in enumerate(entries):
        periods[client] = _number(entry, "finish_time", client, field, path)
        active, inactive = (entry.get(key) if isinstance(entry, Mapping) else None for key in ("active", "inactive"))
        if not _numbers(active) or not _numbers(inactive) or len(inactive) < len(active):
            raise ConfigError(
                f"{field}={path!r}: client {client}'s 'active' and 'inactive' must be lists of numbers, an end for "
                f"every start (window k is [active[k], inactive[k])), but got {active!r} and {inactive!r}"
            )
        clients.extend([client] * len(active))
        starts.extend(active)
        ends.extend(inactive[: len(active)])  # an end past the last start is unused, as FedScale reads it
    return Availability.from_windows(
        np.array(clients, dtype=np.int64),
        np.array(starts, dtype=np.float64),
        np.array(ends, dtype=np.float64),
        periods,
        num_clients,
        f"{field}={path!r}",
    )


def _numbers(values: Any) -> TypeGuard[list[float]]:
    """Whether ``values`` is a list of numbers."""
    return isinstance(values, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def is_table(path: str) -> bool:
    """Whether ``path`` names a table (``.csv``, ``.parquet``) rather than a FedScale pickle."""
    return path.lower().endswith(TABLE_SUFFIXES)


def read_table(path: str, field: str, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The named columns of a .csv or .parquet table; ConfigError naming ``field`` for an unreadable file or a
    missing column."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path) if path.lower().endswith(".parquet") else pcsv.read_csv(path)
    except (OSError, pa.ArrowException) as error:
        raise ConfigError(
            f"{field}={path!r} cannot be read as a table ({error}); give a readable .csv or .parquet"
        ) from None
    missing = [name for name in columns if name not in table.column_names]
    if missing:
        raise ConfigError(
            f"{field}={path!r} has no column {', '.join(map(repr, missing))}; its columns are "
            f"{', '.join(table.column_names)}, and it needs {', '.join(columns)}"
        )
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in columns}


def _numbers_of(table: dict[str, np.ndarray], name: str, rows: np.ndarray, field: str, path: str) -> np.ndarray:
    """Column ``name`` at ``rows`` as float64; ConfigError naming the client and the cell that is not a number
    (a .csv column with one such cell is read as text)."""
    values = table[name][rows]
    try:
        return values.astype(np.float64)
    except (TypeError, ValueError):
        row = next(row for row, value in zip(rows, values, strict=True) if not _is_number_text(value))
        raise ConfigError(
            f"{field}={path!r}: client {int(table['client_id'][row])}'s {name} is {values[rows == row][0]!r}, not a "
            f"number; write every {name} as a number"
        ) from None


def _is_number_text(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _client_ids(ids: np.ndarray, num_clients: int, field: str, path: str, *, one_row_each: bool) -> np.ndarray:
    """``ids`` as int64, each in [0, num_clients) (rows of later clients are ignored), and every client present
    (once, with ``one_row_each``); ConfigError naming the missing or repeated ones."""
    if not np.issubdtype(ids.dtype, np.integer):
        raise ConfigError(f"{field}={path!r}: client_id must hold integers, but holds {ids.dtype}")
    ids = ids.astype(np.int64)
    if (ids < 0).any():
        raise ConfigError(f"{field}={path!r}: client_id {int(ids[ids < 0][0])} is negative; clients are 0, 1, ...")
    counts = np.bincount(ids[(ids >= 0) & (ids < num_clients)], minlength=num_clients)
    missing = np.flatnonzero(counts == 0)
    if len(missing):
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        raise ConfigError(
            f"{field}={path!r} has no row for {len(missing)} of the run's {num_clients} clients (client_id "
            f"{shown}); give every client_id from 0 to {num_clients - 1} a row"
        )
    if one_row_each and (counts > 1).any():
        raise ConfigError(f"{field}={path!r}: client_id {int(np.flatnonzero(counts > 1)[0])} has more than one row")
    return ids


def table_devices(path: str, num_clients: int) -> DeviceColumns:
    """A device table: client_id, slowdown (time per step over the reference device's), download_mbps and
    upload_mbps."""
    field = "system.device_trace"
    table = read_table(path, field, ("client_id", "slowdown", "download_mbps", "upload_mbps"))
    ids = _client_ids(table["client_id"], num_clients, field, path, one_row_each=True)
    rows = np.flatnonzero(ids < num_clients)
    order = rows[np.argsort(ids[rows])]
    columns = []
    for name in ("slowdown", "download_mbps", "upload_mbps"):
        values = _numbers_of(table, name, order, field, path)
        refuse_not_positive(values, f"{field}={path!r}", name)
        columns.append(values)
    slowdown, down, up = columns
    return slowdown, down * 1e6 / 8, up * 1e6 / 8


def table_availability(path: str, num_clients: int) -> Availability:
    """An availability table: one row per online window, client_id, start_s, end_s and period_s (the same for
    every window of a client)."""
    field = "system.availability_trace"
    table = read_table(path, field, ("client_id", "start_s", "end_s", "period_s"))
    ids = _client_ids(table["client_id"], num_clients, field, path, one_row_each=False)
    rows = np.flatnonzero(ids < num_clients)
    starts, ends, period = (_numbers_of(table, name, rows, field, path) for name in ("start_s", "end_s", "period_s"))
    ids = ids[rows]
    periods = np.full(num_clients, np.nan)
    periods[ids] = period
    if (periods[ids] != period).any():
        client = int(ids[np.flatnonzero(periods[ids] != period)[0]])
        raise ConfigError(f"{field}={path!r}: client {client}'s rows give different period_s; give one per client")
    return Availability.from_windows(ids, starts, ends, periods, num_clients, f"{field}={path!r}")
