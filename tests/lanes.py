"""The suite's two lanes, marked at collection: ``pytest -m "not slow"`` is the development loop, ``pytest`` all.

A test is ``slow`` when it starts Ray, spawns a process, runs the engine end to end, or was measured to take more
than a few seconds on the 2-core box. The first three are read from its code, so that a new test falls in its
lane without an edit:
the test function, its fixtures and the functions they call that are defined under ``tests/`` are walked
(never rayfed's or a library's), and the test is ``slow`` when that code

* asks for the session's Ray (the ``ray_cluster`` fixture), calls ``ray.init``, starts a Ray cluster
  (``rayfed.actors.cluster.ray_started``, ``ray.cluster_utils.Cluster``) or runs with ``engine.backend=ray``;
* uses ``subprocess`` or ``multiprocessing``;
* runs the engine end to end (``rayfed.run``, ``Simulation``, ``rayfed.tuning.tune``, or the command line's
  ``run``, ``tune`` and ``reproduce``): a tiny run takes 2 to 10 seconds on the 2-core box.

The others that took more than a few seconds are listed in :data:`MEASURED`, from ``pytest --durations=0``. What
stays in the fast lane, and must (every folder of tests/, the contract of the one loop for every registered
method, the phase checks, the summation tree), ``tests/test_lanes.py`` checks.

Tests that share the session's Ray run on one pytest-xdist worker (``xdist_group("ray")``, with
``--dist loadgroup``), one after the other as in a serial run.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

import rayfed
from rayfed.cli import main
from rayfed.tuning import tune

__all__ = ["MEASURED", "HYPOTHESIS_PROFILES", "hypothesis_profile", "pytest_collection_modifyitems", "why_slow"]

RAY_FIXTURES = frozenset({"ray_cluster"})
"""Fixtures that start or hand out a Ray cluster."""

RAY_STARTERS = frozenset({"ray_started", "Cluster"})
"""Functions and classes that start a Ray cluster (rayfed's and ``ray.cluster_utils``')."""

RAY_BACKEND = frozenset({"engine.backend=ray", "--backend=ray"})
"""Override strings that ask for a run on Ray (as does the key ``engine.backend`` beside the value ``ray``)."""

SPAWNING = frozenset({"subprocess", "multiprocessing"})
"""Packages whose functions start processes."""

ENGINE = (rayfed.run, rayfed.Simulation, tune)
"""What runs the engine end to end (and so takes seconds)."""

COMMANDS = (main, frozenset({"run", "tune", "reproduce"}))
"""The command line, and its subcommands that run the engine."""

MEASURED: dict[str, str] = {
    "tests/benchmarks/test_step_overhead.py": "16.5 s",
    "tests/train/test_every_method_stacks.py::test_short_last_batches_are_padded_in_a_stack[fedclassavg]": "21.9 s",
    "tests/algorithms/test_fedadam.py::"
    "test_the_default_server_lr_learns_where_the_flag_default_of_one_collapses": "14.3 s",
    "tests/execution/test_eval_plans.py::test_the_evaluation_plan_equals_a_forward_per_client[fedclassavg]": "7.7 s",
    "tests/execution/test_reads_back_once.py::"
    "test_a_training_call_reads_its_values_back_once_on_the_cpu[fedclassavg-on]": "6.4 s",
}
"""Tests the rules above do not find that took more than 5 s on the 2-core box (node id, or a file for all its
tests) -> what ``pytest -p no:xdist --durations=0`` measured (2026-11-28, the box shared, load 3 to 5). The
stacking contract of every method stays in the fast lane whatever it takes (up to 18 s for one method)."""


HYPOTHESIS_PROFILES = {"fast lane": 12, "full suite": 40}
"""The examples a property-based test (Hypothesis) draws: a small budget where the slow lane is left out
(``-m "not slow"``), a larger one in the full suite; both derandomized (a fixed seed, so a run repeats)."""


def hypothesis_profile(config: pytest.Config) -> str:
    """The Hypothesis profile of this session (:data:`HYPOTHESIS_PROFILES`), registered and loaded: the fast lane's
    when the marker expression leaves the slow lane out."""
    from hypothesis import HealthCheck, settings

    for name, examples in HYPOTHESIS_PROFILES.items():
        settings.register_profile(
            name,
            max_examples=examples,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
    chosen = "fast lane" if "not slow" in (config.getoption("markexpr", "") or "") else "full suite"
    settings.load_profile(chosen)
    return chosen


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every collected test's lane, and the xdist group of those sharing the session's Ray."""
    for item in items:
        why = why_slow(item)
        if why and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow(reason=why))
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("ray"))


def why_slow(item: pytest.Item) -> str | None:
    """Why ``item`` belongs to the slow lane, or None when it belongs to both."""
    if item.get_closest_marker("slow"):
        return "marked slow"
    if item.nodeid in MEASURED or item.nodeid.partition("::")[0] in MEASURED:
        return "measured"
    if RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "uses the session's Ray"
    code = _Reached(_entry_points(item), item.config.rootpath / "tests")
    if code.starts_ray():
        return "starts Ray"
    if code.spawns():
        return "spawns processes"
    if code.runs_the_engine():
        return "runs the engine"
    return None


def _entry_points(item: pytest.Item) -> Iterator[Callable[..., Any]]:
    """The test's function and its fixtures' (none for a doctest); only those under ``tests/`` are walked."""
    function = getattr(item, "function", None)
    if function is None:
        return
    yield function
    info = getattr(item, "_fixtureinfo", None)
    for definitions in info.name2fixturedefs.values() if info else ():
        for definition in definitions:
            yield definition.func


class _Reached:
    """What the code reachable from some entry points reads: names, strings and the objects its global names
    stand for; functions defined under ``tests`` are followed."""

    def __init__(self, entry_points: Iterable[Callable[..., Any]], tests: Path) -> None:
        self.names: set[str] = set()
        self.strings: set[str] = set()
        self.objects: list[object] = []
        seen: set[types.CodeType] = set()
        todo = [(_code(function), getattr(function, "__globals__", {})) for function in entry_points]
        todo = [(code, namespace) for code, namespace in todo if code and _under(code, tests)]  # not a library's
        while todo:
            code, namespace = todo.pop()
            if code is None or code in seen:
                continue
            seen.add(code)
            self.names.update(code.co_names)
            for constant in code.co_consts:
                if isinstance(constant, str):
                    self.strings.add(constant)
                elif isinstance(constant, types.CodeType):  # a nested function, lambda or comprehension
                    todo.append((constant, namespace))
            for name in code.co_names:
                found = namespace.get(name)
                if found is None:
                    continue
                self.objects.append(found)
                inner = _code(found) if inspect.isfunction(found) else None
                if inner is not None and _under(inner, tests):
                    todo.append((inner, found.__globals__))

    def starts_ray(self) -> bool:
        """Whether the code starts a Ray cluster, asks for the session's, or runs on Ray."""
        return bool(
            self.names & RAY_FIXTURES
            or {"ray", "init"} <= self.names  # ray.init, the module imported at the top or in the function
            or any(getattr(found, "__name__", None) in RAY_STARTERS for found in self.objects)
            or self.strings & RAY_BACKEND
            or {"engine.backend", "ray"} <= self.strings
        )

    def runs_the_engine(self) -> bool:
        """Whether the code runs the engine end to end: a run, a study, or a command that runs one."""
        reached = self.objects + [getattr(found, name, None) for found in self.modules() for name in self.names]
        command, subcommands = COMMANDS
        return any(found is runner for found in reached for runner in ENGINE) or (
            any(found is command for found in reached) and bool(self.strings & subcommands)
        )

    def modules(self) -> list[types.ModuleType]:
        """The modules the code names (``rayfed`` of ``rayfed.run``)."""
        return [found for found in self.objects if isinstance(found, types.ModuleType)]

    def spawns(self) -> bool:
        """Whether the code starts processes: it uses a spawning module, or a function or class of one."""
        return any(_package(found) in SPAWNING for found in self.objects)


def _package(found: object) -> str | None:
    """The top-level package ``found`` is, or was defined in."""
    name = found.__name__ if isinstance(found, types.ModuleType) else getattr(found, "__module__", None)
    return name.partition(".")[0] if isinstance(name, str) else None


def _under(code: types.CodeType, tests: Path) -> bool:
    """Whether ``code`` was written in a file under ``tests`` (a fixture or helper of the tests' own)."""
    return Path(code.co_filename).resolve().is_relative_to(tests)


def _code(function: Any) -> types.CodeType | None:
    return getattr(inspect.unwrap(function), "__code__", None) if callable(function) else None
