"""The two lanes (tests/lanes.py): a test that starts Ray or a process is marked ``slow`` from its code, its
helpers' and its fixtures' under tests/ (never a plugin's), and the fast lane keeps a test of every package and
every guarantee."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfed.algorithms import ALGORITHMS

EXAMPLES = """
import subprocess
import sys

import pytest
import ray

from rayfed.actors.cluster import ray_started


def _python(code):
    return subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture
def server():
    return subprocess.Popen([sys.executable, "-c", "pass"])


def test_plain():
    assert sum([1, 2]) == 3


def test_spawns_through_a_helper():
    _python("pass")


def test_spawns_through_a_fixture(server):
    server.wait()


def test_starts_ray():
    ray.init(address="local")


def test_starts_a_private_ray():
    with ray_started(None):
        pass


def test_runs_on_ray():
    run({"engine.backend": "ray"})


def test_runs_on_ray_from_the_command_line():
    main(["run", "engine.backend=ray"])


def test_shares_the_session_ray(ray_cluster):
    pass


@pytest.mark.slow
def test_marked():
    pass
"""


def test_a_test_that_starts_ray_or_a_process_is_slow_and_one_that_shares_the_session_ray_is_grouped(
    pytester: pytest.Pytester,
) -> None:
    # The conftest is outside tests/, as a plugin's fixtures are: its autouse fixture's processes are not the tests'.
    pytester.makeconftest(
        "import subprocess\n\nimport pytest\n\nfrom tests.lanes import pytest_collection_modifyitems\n\n\n"
        "@pytest.fixture\ndef ray_cluster():\n    pass\n\n\n"
        "@pytest.fixture(autouse=True)\ndef plugins_own():\n    return subprocess.run\n"
    )
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_lane_examples.py").write_text(EXAMPLES)

    items, _ = pytester.inline_genitems("tests", "-p", "no:cacheprovider")

    lanes = {item.name: ("slow" if item.get_closest_marker("slow") else "fast") for item in items}
    assert lanes == {
        "test_plain": "fast",
        "test_spawns_through_a_helper": "slow",
        "test_spawns_through_a_fixture": "slow",
        "test_starts_ray": "slow",
        "test_starts_a_private_ray": "slow",
        "test_runs_on_ray": "slow",
        "test_runs_on_ray_from_the_command_line": "slow",
        "test_shares_the_session_ray": "slow",
        "test_marked": "slow",
    }
    grouped = [item.name for item in items if item.get_closest_marker("xdist_group")]
    assert grouped == ["test_shares_the_session_ray"]


def test_the_fast_lane_keeps_every_package_and_every_guarantee(request: pytest.FixtureRequest) -> None:
    """In the whole suite's run (either lane): at least 700 fast tests, some of every package of rayfed, among
    them the phase checks, the summation tree, and for every registered method the contract of the one loop
    (its clients trained stacked and one by one) and a tiny run of two rounds (the client-state sizes)."""
    config = request.config
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or config.option.keyword or config.option.deselect:
        pytest.skip("looks at the tests of the whole suite, run as the README's commands run it")
    fast = [item for item in request.session.items if not item.get_closest_marker("slow")]
    files = {Path(str(item.path)).relative_to(config.rootpath).as_posix() for item in fast}
    packages = {path.parent.name for path in (config.rootpath / "rayfed").glob("*/__init__.py")}
    assert len(fast) >= 700
    assert packages - {Path(file).parent.name for file in files if file.startswith("tests/")} == set()
    assert {"tests/train/test_phase_checks.py", "tests/execution/test_summation.py"} <= files
    for test in ("test_every_method_stacks_with_the_results_of_training_one_by_one", "test_the_client_state_estimate"):
        methods = {item.callspec.params["name"] for item in fast if item.name.startswith(test)}
        assert set(ALGORITHMS.shipped()) - methods == set(), test
