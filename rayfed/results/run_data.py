"""What the figures read of a finished run directory: :class:`RunData`, and how runs are grouped and labelled.

A run's ``config.json``, ``rounds.parquet``, its newest checkpoint's server state and, with a system model, the
devices it drew (:func:`load_run`); the runs that are seeds of one method, under one legend entry
(:func:`curve_groups`); a run's accuracy points (:func:`accuracy_points`); and what a method's own figures read
(:func:`finished_run`).

Reading a run runs none of its code: its ``config.json`` is data (:meth:`~rayfed.config.RunConfig.from_saved`
imports none of its ``plugins``). A run whose method this process does not hold (a method of a plugin, not
imported here) is read as a :class:`SavedConfig`: its accuracy curves draw, its method's own figures do not.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rayfed.algorithms import ALGORITHMS
from rayfed.algorithms.figures import FinishedRun
from rayfed.config import RunConfig, read_run_config, read_saved_config
from rayfed.config.retired import without_retired
from rayfed.data import LABEL_COUNTS_FILE, read_label_counts
from rayfed.engine.checkpoint import load_checkpoint, newest_checkpoint
from rayfed.engine.metrics import counted_round, read_rounds_file
from rayfed.engine.privacy_records import EPSILON
from rayfed.scheduling.system_records import AVAILABILITY_FILE, DEVICES_FILE, VIRTUAL_TIME
from rayfed.util.bounded import NUMBER, read_parquet
from rayfed.util.config_tree import get_path, tree_differences
from rayfed.util.errors import CheckpointError, ConfigError

__all__ = [
    "SAME_NUMBERS",
    "SavedConfig",
    "RunData",
    "load_run",
    "method_label",
    "CurveGroup",
    "curve_groups",
    "accuracy_points",
    "virtual_time_points",
    "epsilon_points",
    "TIME_UNITS",
    "time_unit",
    "longest_virtual_time",
    "client_timeline",
    "finished_run",
]

SAME_NUMBERS = (
    "run_dir",
    "data.root",
    "data.download",
    "engine.backend",
    "engine.num_workers",
    "engine.num_cpus_per_worker",
    "engine.checkpoint_every",
    "engine.ray_address",
    "engine.resource_wait_s",
    "engine.dashboard",
    "engine.round_timeout_s",
    "engine.max_retries",
    "engine.client_state_memory_mb",
    "engine.progress",
)
"""Config paths that change no number of a run (where it runs and writes, how it is watched and kept: the same
config gives the same metrics on ``local`` and on Ray with any ``num_workers``), so no legend names them."""
_SEED_ONLY = ("seed", *SAME_NUMBERS)
"""Config paths in which the seeds of one method may differ (``RunConfig.diff``'s ``ignore``)."""


class SavedConfig:
    """A run's config as data, where this process does not hold a name it uses (a plugin's method): its fields
    read as a :class:`~rayfed.config.RunConfig`'s are (``config.algorithm.name``), and it compares as one does."""

    def __init__(self, tree: Mapping[str, Any]) -> None:
        self._tree = dict(tree)

    def __getattr__(self, name: str) -> Any:
        try:
            value = self.__dict__["_tree"][name]
        except KeyError:
            raise AttributeError(name) from None
        return SavedConfig(value) if isinstance(value, Mapping) else value

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._tree))

    def diff(self, other: Any, *, ignore: tuple[str, ...] = ()) -> list[str]:
        """As :meth:`RunConfig.diff`, over the trees."""
        return tree_differences(self.to_dict(), other.to_dict(), ignore=ignore)


@dataclass
class RunData:
    """What the figures need from one run directory."""

    run_dir: Path
    config: RunConfig | SavedConfig
    """The run's config: a :class:`~rayfed.config.RunConfig`, or a :class:`SavedConfig` where this process does
    not hold its method (:attr:`method_held`)."""
    rounds: list[dict[str, Any]]
    server: dict[str, np.ndarray] = field(default_factory=dict)
    """``server/*`` arrays of the newest checkpoint, without the prefix (empty if none)."""
    checkpoint_round: int | None = None
    """The round (0-based) after which that checkpoint was taken."""
    devices: dict[str, np.ndarray] = field(default_factory=dict)
    """With a system model, the devices the run drew (``devices.parquet``), column by column: ``client_id``,
    ``slowdown``, ``download_mbps``, ``upload_mbps`` (empty without one, or for a run from before issue 65)."""
    availability: dict[str, np.ndarray] = field(default_factory=dict)
    """Their online windows (``availability.parquet``): ``client_id``, ``start_s``, ``end_s``, ``period_s``, one
    entry per window (empty when every client is always online)."""

    @property
    def has_rounds(self) -> bool:
        """Whether the run recorded a round (the initial model's evaluation alone is none)."""
        return any(int(row["round"]) >= 0 for row in self.rounds)

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def algorithm(self) -> str:
        return str(self.config.algorithm.name)

    @property
    def method_held(self) -> bool:
        """Whether this process holds the run's method (its own figures can be drawn)."""
        return isinstance(self.config, RunConfig)

    @property
    def has_label_counts(self) -> bool:
        """Whether the run recorded its clients' class counts (``label_counts.parquet``), which its method's own
        figures read; a run from before that file has none, and reading a run never loads its dataset."""
        return (self.run_dir / LABEL_COUNTS_FILE).is_file()


def load_run(run_dir: str | Path) -> RunData:
    """Read ``config.json`` (as data: nothing it names is imported), ``rounds.parquet`` and the newest
    checkpoint's server state."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise CheckpointError(f"{str(run_dir)!r} is not a run directory (no config.json)")
    config = _saved_config(run_dir / "config.json")
    rounds_file = run_dir / "rounds.parquet"
    try:
        rounds = read_rounds_file(rounds_file) if rounds_file.is_file() else []
    except ValueError as error:
        raise CheckpointError(
            f"{str(rounds_file)!r} cannot be read: {error}; restore it from a copy of the run, or leave this run out"
        ) from None
    devices, availability = _columns(run_dir / DEVICES_FILE), _columns(run_dir / AVAILABILITY_FILE)
    newest = newest_checkpoint(run_dir)
    if newest is None:
        return RunData(run_dir, config, rounds, devices=devices, availability=availability)
    checkpoint = load_checkpoint(newest)
    return RunData(run_dir, config, rounds, checkpoint.server, checkpoint.round, devices, availability)


def _columns(path: Path) -> dict[str, np.ndarray]:
    """A parquet file's columns of numbers as numpy arrays (none if it is not there), bounded as every table a reader
    opens (:func:`rayfed.util.bounded.read_parquet`)."""
    if not path.is_file():
        return {}
    table = _table(path, {"*": NUMBER})
    return {name: table[name].to_numpy() for name in table.column_names}


def _table(path: Path, kinds: Mapping[str, str]) -> Any:
    """The Parquet table at ``path``, bounded and its columns of ``kinds`` (:func:`rayfed.util.bounded.read_parquet`);
    CheckpointError naming the file and the fix if it is damaged."""
    try:
        return read_parquet(path, kinds)
    except ValueError as error:
        raise CheckpointError(
            f"{str(path)!r} cannot be read: {error}; restore it from a copy of the run, or leave this run out"
        ) from None


def _saved_config(path: Path) -> RunConfig | SavedConfig:
    """A run's config: typed where this process holds every name it uses, else (a plugin's method, not imported
    here) as data; CheckpointError naming the file if it cannot be read."""
    saved = read_saved_config(path)
    if saved.get("plugins"):
        try:
            return RunConfig.from_saved(saved)
        except ConfigError:
            return SavedConfig(without_retired(saved))
    return read_run_config(path)


def method_label(config: RunConfig | SavedConfig) -> str:
    """The run's method as its algorithm labels it (``FedAvg``, ``FedAWA (code)``, ``cwFedAvg w/ Dist. (Output)``);
    its name where this process does not hold it."""
    if not isinstance(config, RunConfig):
        return str(config.algorithm.name)
    return ALGORITHMS.get(config.algorithm.name).label(config.algorithm.params)


@dataclass
class CurveGroup:
    """Runs drawn in one colour under one legend entry: the seeds of one method."""

    legend: str
    runs: list[RunData]


def curve_groups(runs: Sequence[RunData]) -> list[CurveGroup]:
    """Group ``runs`` as seeds of one method when their configs differ in ``seed`` (and ``run_dir``) alone.

    Each group's legend is its method label, followed by ``path=value`` for every field in
    which it differs from another group of the same label, so no two entries read alike;
    ``(N seeds)`` is added to a group of several runs.
    """
    grouped: list[list[RunData]] = []
    trees = {id(run): run.config.to_dict() for run in runs}

    def differences(a: RunData, b: RunData) -> list[str]:
        return tree_differences(trees[id(a)], trees[id(b)], ignore=_SEED_ONLY)

    for run in runs:
        same = next((g for g in grouped if not differences(run, g[0])), None)
        if same is None:
            grouped.append([run])
        else:
            same.append(run)
    labels = [method_label(g[0].config) for g in grouped]
    result = []
    for group, label in zip(grouped, labels):
        paths = sorted(
            {
                line.split(": ", 1)[0]
                for other, other_label in zip(grouped, labels)
                if other is not group and other_label == label
                for line in differences(group[0], other[0])
            }
        )
        tree = trees[id(group[0])]
        legend = ", ".join([label, *(f"{path}={_override_text(get_path(tree, path))}" for path in paths)])
        result.append(CurveGroup(legend + (f" ({len(group)} seeds)" if len(group) > 1 else ""), group))
    return result


def _override_text(value: Any) -> str:
    """A value as ``field.path=value`` writes it on the command line."""
    return value if isinstance(value, str) else json.dumps(value)


def accuracy_points(run: RunData, column: str = "accuracy") -> tuple[list[int], list[float]]:
    """(round, pooled accuracy in %) of the run's evaluated rounds, the round counted as the progress bar counts
    it: ``rounds.parquet``'s 0-based round + 1, so 1 is the first round and 0 the initial model (its row -1).

    ``column="global_accuracy"`` gives the global model's curve on the same clients (none for an
    algorithm without a global model besides the evaluated ones, or a run written before it existed).
    """
    x, y = _points(run, column, lambda row: counted_round(int(row["round"])))
    return [int(v) for v in x], y


def virtual_time_points(
    run: RunData, column: str = "accuracy", unit_s: float = 3600.0
) -> tuple[list[float], list[float]]:
    """(virtual time in units of ``unit_s`` seconds, hours by default, pooled accuracy in %) of the run's evaluated
    rounds: the end of each round on the system model's clock (``virtual_time_s``, docs/system.md), 0 for the
    initial model; none for a run without a system model."""
    return _points(run, column, lambda row: None if row.get(VIRTUAL_TIME) is None else row[VIRTUAL_TIME] / unit_s)


def epsilon_points(run: RunData, column: str = "accuracy") -> tuple[list[float], list[float]]:
    """(ε spent so far, pooled accuracy in %) of the run's evaluated rounds with privacy on (``rounds.parquet``'s
    ``epsilon``, docs/privacy.md); none for a run without privacy, and no point where ε is 0 or infinite (the
    initial model; no noise), which a logarithmic axis cannot place."""
    return _points(run, column, lambda row: row[EPSILON] if 0 < (row.get(EPSILON) or 0) < math.inf else None)


TIME_UNITS = (("seconds", 1.0), ("minutes", 60.0), ("hours", 3600.0), ("days", 86400.0))


def time_unit(longest_s: float) -> tuple[str, float]:
    """The unit a virtual-time axis that runs to ``longest_s`` seconds reads best in, and its seconds: the largest
    of :data:`TIME_UNITS` of which it spans at least two (a 219-s run in minutes, a week in days).

    >>> time_unit(42.5), time_unit(219.0), time_unit(7200.0), time_unit(7 * 86400.0)
    (('seconds', 1.0), ('minutes', 60.0), ('hours', 3600.0), ('days', 86400.0))
    """
    return [(name, seconds) for name, seconds in TIME_UNITS if longest_s >= 2 * seconds or seconds == 1.0][-1]


def longest_virtual_time(runs: Sequence[RunData]) -> float:
    """The largest ``virtual_time_s`` the runs recorded (0 without a system model)."""
    times = [row[VIRTUAL_TIME] for run in runs for row in run.rounds if row.get(VIRTUAL_TIME) is not None]
    return max((t for t in times if math.isfinite(t)), default=0.0)


def client_timeline(run: RunData) -> dict[str, np.ndarray]:
    """Who trained when in a run with a system model, from its per-client files: one entry per client a round
    sampled (an asynchronous run: per arrival or loss an asynchronous step records), its ``client_id``, ``round``,
    ``status``, when its work began (``start_s``: the round's start; an asynchronous client's launch) and when it
    ended (``end_s``: its upload's arrival, or an asynchronous lost client's loss, ``lost_s``, else the round's or
    step's end: a late client trains until the round leaves it out); empty for a run without a system model or one
    recorded before its rows held these times."""
    ends = {int(row["round"]): row[VIRTUAL_TIME] for row in run.rounds if row.get(VIRTUAL_TIME) is not None}
    parts = []
    for path in sorted((run.run_dir / "clients").glob("round_*.parquet")):
        names = _table(path, {}).column_names
        if "start_s" not in names:
            return {}
        kinds = {"client_id": NUMBER, "round": NUMBER, "start_s": NUMBER, "finish_s": NUMBER}
        table = _table(path, {**kinds, **({"lost_s": NUMBER} if "lost_s" in names else {})})
        if "status" not in table.column_names:
            raise CheckpointError(f"{str(path)!r} has no column 'status'; restore it from a copy of the run")
        rows = table.filter(table["status"].is_valid())
        parts.append({name: rows[name].to_numpy(zero_copy_only=False) for name in ("client_id", "round", "status")})
        parts[-1]["start_s"] = rows["start_s"].to_numpy()
        finish = rows["finish_s"].to_numpy(zero_copy_only=False).astype(np.float64)
        if "lost_s" in rows.column_names:  # an asynchronous lost client's line ends at its loss
            lost = rows["lost_s"].to_numpy(zero_copy_only=False).astype(np.float64)
            finish = np.where(np.isnan(finish), lost, finish)
        end = ends.get(int(path.stem.split("_")[1]), np.nan)
        parts[-1]["end_s"] = np.fmin(np.where(np.isnan(finish), end, finish), end)
    if not parts:
        return {}
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _points(run: RunData, column: str, x_of: Callable[[dict[str, Any]], float | None]) -> tuple[list, list[float]]:
    """(x, 100 × ``column``) of the rows where both are known."""
    values = [(x_of(r), r.get(column)) for r in run.rounds]
    points = [(x, 100 * y) for x, y in values if x is not None and y is not None and not math.isnan(y)]
    return [x for x, _ in points], [y for _, y in points]


def finished_run(run: RunData) -> FinishedRun:
    """What a method's figures read: the server state, the clients' class counts (``label_counts.parquet``) and
    the problem rebuilt without data (the one problem builder, on the ``meta`` device); a run whose method is
    held here.

    A run without ``label_counts.parquet`` (written before rayfed recorded it) raises CheckpointError: its
    figures would need the dataset its config names, and reading a run directory never loads, extracts or
    downloads what it points to (README.md, "What a run directory may do")."""
    from rayfed.engine.problem_build import ShapeOnly, build_problem

    assert isinstance(run.config, RunConfig), "a method's figures need its method (RunData.method_held)"
    if not run.has_label_counts:
        raise CheckpointError(
            f"{str(run.run_dir)!r} has no {LABEL_COUNTS_FILE} (a run from before rayfed recorded its clients' class "
            "counts), which its method's figures read; reading a run never loads the dataset its config names, so "
            "only its accuracy curve can be drawn (rerun it with this rayfed for its figures)"
        )
    try:
        counts, train_counts, shape = read_label_counts(run.run_dir / LABEL_COUNTS_FILE)
    except ValueError as error:
        raise CheckpointError(
            f"{str(run.run_dir / LABEL_COUNTS_FILE)!r} cannot be read: {error}; restore it from a copy of the run, "
            "or delete it to draw the run's accuracy curve alone"
        ) from None
    spec, _ = build_problem(run.config, ShapeOnly(tuple(shape), counts.shape[1]), device="meta")
    return FinishedRun(run.server, counts, train_counts, spec)
