"""Helpers shared by the benchmark scripts: a private Ray for the run, per-round wall-clock timing,
the proportional memory (PSS) and the CPU time of a process tree, and where a script's files go.

A benchmark writes into the repository's tracked files (``benchmarks/results/``) only when asked with
``--record``, and then records the commit it measured beside its figures (:func:`output_path`,
:func:`provenance`); ``--out PATH`` writes anywhere else; without either it writes nothing, so that
measuring never dirties the tree.

Not part of the ``rayfed`` package; the scripts in this folder import it as a sibling module.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rayfed.engine.callbacks import Callback

__all__ = [
    "RESULTS",
    "CpuMeter",
    "RoundTimer",
    "PssSampler",
    "add_output_arguments",
    "output_path",
    "private_ray",
    "provenance",
    "median_after_warmup",
    "process_cpu_s",
    "process_tree_pss",
]

RESULTS = Path(__file__).resolve().parent / "results"
"""The tracked folder of recorded figures: written only with ``--record``."""


class RoundTimer(Callback):
    """Wall-clock seconds of every round, callbacks (metrics files) included.

    Round t lasts from the end of round t-1 (or the start of the run) to the end of
    round t, so the sum of the durations is the whole loop. A subclass may read another
    clock (``clock = staticmethod(time.process_time)``).
    """

    clock = staticmethod(time.perf_counter)

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._last = 0.0

    def on_run_start(self, run) -> None:
        self._last = self.clock()

    def after_round(self, run, record, clients) -> bool:
        now = self.clock()
        self.seconds.append(now - self._last)
        self._last = now
        return False


def median_after_warmup(seconds: list[float], warmup: int = 1) -> float:
    """Median of the round times after the first ``warmup`` rounds (workers start, models are built)."""
    measured = seconds[warmup:] or seconds
    return statistics.median(measured)


def add_output_arguments(parser: argparse.ArgumentParser, recorded: str) -> None:
    """``--out PATH`` (write there) and ``--record`` (write ``benchmarks/results/<recorded>``, which is tracked)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=None, help="write the results here (default: nowhere)")
    where.add_argument(
        "--record",
        action="store_true",
        help=f"record the results, with the commit measured, in benchmarks/results/{recorded} (tracked)",
    )


def output_path(args: argparse.Namespace, recorded: str) -> Path | None:
    """Where :func:`add_output_arguments`' options send the results: ``benchmarks/results/<recorded>`` with
    ``--record``, ``--out``'s path, or None (nothing is written)."""
    return RESULTS / recorded if args.record else args.out


def provenance() -> dict[str, object]:
    """What a recorded figure was measured on: the commit (and whether the tree differed from it), the date, the
    machine and its load."""
    root = Path(__file__).resolve().parents[1]

    def git(*words: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *words], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD"),
        "tree_differs": bool(git("status", "--porcelain", "--untracked-files=no")),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{_cpu_model()}, {os.cpu_count()} CPUs",
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@contextmanager
def private_ray(num_cpus: int | None = None) -> Iterator[None]:
    """A fresh local Ray for the benchmark (never a stale cluster's address), shut down afterwards."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING")
    try:
        yield
    finally:
        ray.shutdown()


def _children(proc: Path = Path("/proc")) -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc/<pid>/stat (field 4 is the parent's pid)."""
    tree: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the command name may hold spaces and ")"
        tree.setdefault(parent, []).append(int(entry.name))
    return tree


def _argv(pid: int) -> list[str]:
    """The process's command line as words ([] once it has ended)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _name(argv: list[str]) -> str:
    """A short name: Ray's process title without the method it runs (``ray::ClientWorker``), a module run with
    ``-m`` (``rayfed.util.reaper``), or the program's file name."""
    if not argv:
        return "?"
    first = argv[0].split()[0]
    if first.startswith("ray::"):
        return first.split(".")[0]  # ray::ClientWorker.train: the title names the running method too
    if len(argv) > 2 and argv[1] == "-m":
        return argv[2]
    script = next((w for w in argv[1:] if w.endswith(".py")), None)
    return Path(script or first).name


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree(root: int, skip: str) -> list[tuple[int, str]]:
    """(pid, name) of ``root`` (named "driver") and its descendants (``_name``), leaving out the subtrees whose
    root's command line contains ``skip`` (the benchmark's own multiprocessing children and resource tracker)."""
    tree, found = _children(), []
    stack = [root]
    while stack:
        pid = stack.pop()
        argv = _argv(pid)
        if pid != root and (not argv or skip in " ".join(argv)):
            continue
        found.append((pid, "driver" if pid == root else _name(argv)))
        stack.extend(tree.get(pid, []))
    return found


def process_tree_pss(root: int, skip: str = "multiprocessing") -> dict[str, float]:
    """PSS in MB of ``root`` and its descendants, summed per process name (``_name``).

    PSS (proportional set size, /proc/<pid>/smaps_rollup) charges each shared page to
    its sharers in equal parts, so the sum over processes counts shared libraries and
    Ray's object store once. Subtrees whose root's command line contains ``skip`` are
    left out (the benchmark's own multiprocessing children and resource tracker).
    """
    totals: dict[str, float] = {}
    for pid, name in _tree(root, skip):
        totals[name] = totals.get(name, 0.0) + _pss_kb(pid) / 1024
    return totals


def process_cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has run so far, all its threads (``/proc/<pid>/task/*/schedstat``); 0 once it
    has ended."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):  # the thread ended meanwhile
                continue
    except OSError:
        return 0.0
    return total / 1e9


class CpuMeter:
    """CPU seconds of a process tree between two readings, per process name: what each of rayfed's processes
    (driver, ClientWorkers, ServerActor, Ray's daemons, the reaper) spent in a stretch of time.

    :meth:`start` and :meth:`stop` read every process's CPU; the root's is read last on starting and first on
    stopping, so that reading the others is left out of the root's figure."""

    def __init__(self, root: int, skip: str = "multiprocessing") -> None:
        self.root, self.skip = root, skip
        self._at: dict[int, float] = {}

    def _read(self, root_last: bool) -> dict[int, tuple[str, float]]:
        procs = _tree(self.root, self.skip)
        procs.sort(key=lambda item: (item[0] == self.root) == root_last)
        return {pid: (name, process_cpu_s(pid)) for pid, name in procs}

    def start(self) -> None:
        self._at = {pid: cpu for pid, (_, cpu) in self._read(root_last=True).items()}

    def stop(self) -> dict[str, float]:
        """CPU seconds per process name since :meth:`start` (a process started since counts from its start)."""
        spent: dict[str, float] = {}
        for pid, (name, cpu) in self._read(root_last=False).items():
            spent[name] = spent.get(name, 0.0) + cpu - self._at.get(pid, 0.0)
        return spent


class PssSampler:
    """Samples :func:`process_tree_pss` of this process's tree every ``interval_s`` in a thread.

    ``peak_mb`` is the largest sum over processes seen, ``peak`` that sample's per-name
    breakdown. Use as a context manager around the part to measure.
    """

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.peak_mb = 0.0
        self.peak: dict[str, float] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pss-sampler", daemon=True)

    def _loop(self) -> None:
        while True:
            totals = process_tree_pss(os.getpid())
            self.samples += 1
            if sum(totals.values()) > self.peak_mb:
                self.peak_mb, self.peak = sum(totals.values()), totals
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> PssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
