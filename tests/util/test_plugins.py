"""A method, model or dataset registered outside rayfed is known to every process of a run (rayfed.util.plugins).

A user's method in a user's file runs on Ray with two workers and gives the numbers of ``engine.backend=local`` to
the last digit (``examples/own_method.py``); a config names the files or modules that register (``plugins``), and
the command line (``rayfed run``, ``--resume``, ``rayfed tune``) imports them first; an installed package's entry
point is found by name; what cannot be sent, or imported, is refused in one line naming it, before anything is
written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rayfed
from rayfed import RunConfig
from rayfed.algorithms import ALGORITHMS
from rayfed.cli import main
from rayfed.config.catalogue import catalogue
from rayfed.util import entry_points, plugins
from rayfed.util.errors import ConfigError, PluginError
from rayfed.util.plugin_sources import import_plugins
from rayfed.util.registry import Registry
from tests.conftest import tiny_overrides
from tests.examples.test_examples import _example

REPO = Path(__file__).resolve().parents[2]
RAYFED = Path(sys.executable).parent / "rayfed"

USER_METHOD = """
from dataclasses import dataclass

from rayfed.algorithms import register_algorithm
from rayfed.algorithms.common.global_model import GlobalModelClient
from rayfed.algorithms.common.proximal import proximal_term
from rayfed.algorithms.fedavg import FedAvgServer
from rayfed.train.phase import Phase


@dataclass(frozen=True)
class Params:
    mu: float = 0.1


class Client(GlobalModelClient):
    def phases(self, message, job):
        return [Phase(epochs=job.train.local_epochs, loss=self.term)]

    def term(self, out, batch, params, constants):
        return proximal_term(params, constants["start"], self.params.mu)


register_algorithm("{name}", params=Params, server=FedAvgServer, client=Client, summary="a user's own")
"""


def _user_file(folder: Path, name: str, body: str = USER_METHOD) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body.replace("{name}", name)))
    return path


def _rounds(run_dir: Path) -> str:
    rows = pq.read_table(run_dir / "rounds.parquet").to_pylist()
    return json.dumps([{k: v for k, v in r.items() if not k.endswith(("_s", "_seconds"))} for r in rows])


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    return subprocess.run([str(RAYFED), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.mark.timeout(300)
def test_a_users_method_in_a_users_file_runs_on_ray_with_two_workers_with_the_numbers_of_local(
    ray_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = _example("own_method")
    assert example.main(["--rounds", "2", "--workers", "2", "--out", str(tmp_path)]) == 0
    assert "same numbers on both backends: True" in capsys.readouterr().out
    assert _rounds(tmp_path / "local") == _rounds(tmp_path / "ray")
    recorded = json.loads((tmp_path / "ray" / "config.json").read_text())["plugins"]
    assert recorded == [str(REPO / "examples" / "own_method.py")]  # its file, for a later --resume


def test_plugins_in_a_config_file_are_imported_by_the_command_line_and_recorded_for_resume(tmp_path: Path) -> None:
    method = _user_file(tmp_path / "code", "cli_method")
    config = tmp_path / "run.toml"
    overrides = tiny_overrides(tmp_path / "run", **{"algorithm.name": "cli_method", "train.rounds": 1})
    config.write_text(
        f"plugins = [{json.dumps(str(method))}]\n"
        + "".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in overrides.items() if k != "data.options")
        + '"data.options" = {num_samples = 3000}\n'
    )
    first = _cli("run", str(config), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["plugins"] == [str(method)] and saved["algorithm"]["name"] == "cli_method"
    resumed = _cli("run", "--resume", str(tmp_path / "run"), "train.rounds=2", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["round"] for r in pq.read_table(tmp_path / "run" / "rounds.parquet").to_pylist()] == [0, 1]


@pytest.mark.timeout(300)
def test_rayfed_tune_imports_the_plugins_its_base_config_names_and_its_parallel_trials_run_them_on_ray(
    tmp_path: Path,
) -> None:
    """Two trials at once on a private Ray, one one-CPU worker each: the workers know the method from the config."""
    method = _user_file(tmp_path / "code", "tuned_method")
    space = tmp_path / "space.yaml"
    space.write_text("algorithm.params.mu: {type: float, low: 0.01, high: 1.0, log: true}\n")
    on_ray = {"engine.backend": "ray", "engine.num_workers": 0, "engine.num_cpus_per_worker": 1}
    overrides = tiny_overrides(tmp_path / "runs", **{"train.rounds": 1, **on_ray})
    sets = [f"{k}={json.dumps(v)}" for k, v in overrides.items() if k != "run_dir"]
    result = _cli(
        "tune",
        str(space),
        f"plugins=[{json.dumps(str(method))}]",
        "algorithm.name=tuned_method",
        *sets,
        "--trials",
        "2",
        "--parallel",
        "2",
        "--study-dir",
        str(tmp_path / "study"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    saved = [json.loads(path.read_text()) for path in sorted((tmp_path / "study").glob("trial_*/config.json"))]
    assert [(c["engine"]["backend"], c["engine"]["num_workers"], c["algorithm"]["name"]) for c in saved] == [
        ("ray", 1, "tuned_method")
    ] * 2


@pytest.mark.parametrize(
    ("module", "words"),
    [
        ("__main__", ["cannot be sent to the run's other processes (TypeError: cannot pickle '_thread.lock'"]),
        ("made_in_memory", ["the module has no file for them to import (it was made in memory)"]),
    ],
)
def test_a_registration_that_cannot_be_sent_is_refused_before_anything_is_written(
    module: str, words: list[str], tmp_path: Path
) -> None:
    """What a script's or notebook's __main__ registers travels by value, and must pickle; a module made in memory
    has no file for Ray's processes to import."""
    body = USER_METHOD.replace("{name}", "unsendable_method").replace(
        "class Client(GlobalModelClient):",
        "class Client(GlobalModelClient):\n    guard = __import__('threading').Lock()",
    )
    made = types.ModuleType(module)  # a module made in memory; as __main__, where a script's code runs
    namespace = made.__dict__ if module != "__main__" else {"__name__": module}
    sys.modules.setdefault(module, made)
    exec(compile(textwrap.dedent(body), "<user code>", "exec"), namespace)
    run_dir = tmp_path / "run"
    config = RunConfig().override(
        tiny_overrides(run_dir, **{"algorithm.name": "unsendable_method", "engine.backend": "ray"})
    )
    try:
        with pytest.raises(PluginError) as raised:
            rayfed.run(config)
    finally:
        ALGORITHMS._items.pop("unsendable_method", None)  # the next tests' Ray runs would carry it
        if sys.modules.get(module) is made:
            del sys.modules[module]
    message = str(raised.value)
    assert f"'unsendable_method' registered by module {module!r}" in message and "engine.backend=local" in message
    assert all(word in message for word in words) and "\n" not in message
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("no_such_plugin_module", ["plugins[0]='no_such_plugin_module'", "no module named", "PYTHONPATH"]),
        ("/no/such/file.py", ["plugins[0]='/no/such/file.py'", "no file"]),
    ],
)
def test_a_plugin_that_cannot_be_imported_is_one_line_naming_it(entry: str, words: list[str]) -> None:
    with pytest.raises(PluginError) as raised:
        RunConfig.from_dict({"plugins": [entry]})
    for word in words:
        assert word in str(raised.value)


def test_a_plugin_that_starts_a_run_when_imported_is_refused(tmp_path: Path) -> None:
    path = _user_file(tmp_path, "runs_at_import", "import rayfed\nrayfed.run({'engine.backend': 'local'})\n")
    with pytest.raises(PluginError, match='started a run when it was imported.*__name__ == "__main__"'):
        import_plugins([str(path)])


def _installed_package(site: Path) -> None:
    """``site`` as site-packages holding a distribution whose entry point names the module that registers."""
    _user_file(site, "installed_method")
    info = site / "installed_method-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: installed-method\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{entry_points.ENTRY_POINTS}]\nmine = installed_method\n")


def test_an_installed_plugin_is_found_by_name_through_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _installed_package(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(entry_points, "_loaded", False)
    assert ALGORITHMS.get("installed_method").summary == "a user's own"
    assert "installed_method" in entry_points._installed  # installed: every process imports it itself, nothing is sent
    assert all(name != "installed_method" for _, name, _, _ in plugins.plugin_registrations())


def test_a_broken_installed_plugin_is_a_warning_and_what_does_not_need_it_goes_on(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Prepare: an installed package whose module raises at its third line.
    site = tmp_path / "site"
    info = site / "broken_method-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-method\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{entry_points.ENTRY_POINTS}]\nmine = broken_method\n")
    (site / "broken_method.py").write_text("import os\n\nraise RuntimeError('half installed')\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(entry_points, "_loaded", False)
    monkeypatch.setattr(entry_points, "_broken", [])
    monkeypatch.setattr(ALGORITHMS, "_complete", False)
    # Execute: rayfed list, a name rayfed holds, the name the package would have registered
    code = main(["list"])
    listed = capsys.readouterr().out
    held = ALGORITHMS.get("fedavg")
    with pytest.raises(ConfigError) as missing:
        ALGORITHMS.get("broken_method")
    # Check: a warning names the package, its file and line; list and fedavg go on; the missing name points at it.
    said = "the installed plugin 'mine' (module broken_method, package 'broken-method', entry point group"
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and said in r.getMessage()]
    assert warned and f"failed to import at {site / 'broken_method.py'}:3: RuntimeError: half installed" in warned[0]
    assert code == 0 and "fedavg" in listed and held is not None
    assert f"it may be registered by {said}" in str(missing.value)


def test_a_plugin_that_fails_at_import_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "fails_at_import.py"
    path.write_text("import os\n\nvalue = 1 / 0\n")
    with pytest.raises(PluginError, match=f"failed to import at {path}:3: ZeroDivisionError"):
        import_plugins([str(path)])


def test_a_registry_finds_installed_plugins_by_itself(tmp_path: Path) -> None:
    """A process that imports only the algorithms (a worker, a script) looks installed plugins up: no other module
    needs to have been imported first to set that up."""
    _installed_package(tmp_path / "site")
    code = (
        "import sys; from rayfed.algorithms import ALGORITHMS; "
        "print(ALGORITHMS.get('installed_method').summary, 'rayfed.util.plugins' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.strip() == "a user's own False", done.stderr[-2000:]


def test_a_run_carries_the_registrations_of_the_modules_whose_names_its_config_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not every registration the process holds: a test's, a notebook's other methods stay where they are."""
    monkeypatch.setattr(Registry, "every", dict(Registry.every))  # the registry below is gone after the test
    widgets: Registry[int] = Registry("test widget", field="widget.name", also_named_by=("widget.spare",))
    widgets.home = "rayfed.util.registry"  # where rayfed keeps a registry (a plugin registers into those)
    widgets.register("a1", origin="user_a")(1)
    widgets.register("a2", origin="user_a")(2)
    widgets.register("b", origin="user_b.sub")(3)
    widgets.register("builtin", origin="rayfed.widgets")(4)

    def carried(config: dict[str, object]) -> set[tuple[str, str]]:
        return {(name, origin) for _, name, _, origin in plugins.plugin_registrations(config)}

    assert carried({"widget": {"name": "a1"}}) == {("a1", "user_a"), ("a2", "user_a")}
    assert carried({"widget": {"name": "builtin", "spare": "b"}}) == {("b", "user_b.sub")}
    assert carried({"widget": {"name": "builtin"}}) == set()


def test_rayfed_list_shows_rayfeds_own_registrations_whatever_the_process_imported(tmp_path: Path) -> None:
    """The listing is cached per source tree: a plugin registered in this process is not part of it."""
    import_plugins([str(_user_file(tmp_path / "code", "listed_method"))])
    listing = catalogue(cache=tmp_path / "cache")
    assert "listed_method" not in listing.algorithms and "fedavg" in listing.algorithms
