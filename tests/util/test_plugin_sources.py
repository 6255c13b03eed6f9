"""A plugin's code is found without running it, travels as data (its file and digest) and is imported by name in
every process, from bytes equal to those recorded (rayfed.util.plugin_sources, rayfed.util.plugins).

What has no importable home (a script's ``__main__``, a notebook) travels by value, with its file name kept for
tracebacks, and a payload over 1 MB is named in a warning with the global that makes it large.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rayfed import RunConfig
from rayfed.algorithms import ALGORITHMS
from rayfed.config.args import config_from_args
from rayfed.util import plugins
from rayfed.util.errors import PluginError
from rayfed.util.plugin_sources import PluginSource, file_digest, import_plugins, load_source, locate
from tests.conftest import tiny_overrides
from tests.util.test_plugins import USER_METHOD, _user_file

REPO = Path(__file__).resolve().parents[2]
SENTINEL = "import pathlib\npathlib.Path({where!r}).write_text('ran')\n"


def test_a_module_name_is_found_in_the_working_directory_without_running_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a module beside the user, not on the path (as for the `rayfed` command), that writes when imported.
    ran = tmp_path / "ran"
    (tmp_path / "located_module.py").write_text(SENTINEL.format(where=str(ran)))
    monkeypatch.chdir(tmp_path)
    # Execute
    source = locate("located_module")
    # Assert: its file and digest, found by reading the folder; nothing ran.
    assert (source.module, source.file, source.kind) == ("located_module", str(tmp_path / "located_module.py"), "name")
    assert source.sha256 == file_digest(tmp_path / "located_module.py") and not ran.exists()
    assert "located_module" not in sys.modules


def test_a_source_is_imported_from_a_copy_of_its_bytes_on_the_path_and_never_from_other_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a node that received the file in a job's working_dir or py_modules, not at the driver's path."""
    # Prepare: the source as the driver recorded it, at a path this "node" does not have.
    driver = _user_file(tmp_path / "driver", "copied_method")
    source = locate(str(driver))
    shipped = tmp_path / "node" / "copied_method.py"
    shipped.parent.mkdir()
    shipped.write_bytes(driver.read_bytes())
    driver.unlink()
    monkeypatch.syspath_prepend(str(shipped.parent))
    # Execute / Assert: the copy with the recorded bytes is imported, under the recorded name.
    try:
        module = load_source(source)
        assert module.__name__ == source.module and module.__file__ == str(shipped)
        assert ALGORITHMS.get("copied_method").summary == "a user's own"
    finally:
        ALGORITHMS._items.pop("copied_method", None)
        sys.modules.pop(source.module, None)
    # A copy of other bytes: refused, naming the module, the recorded digest and what is there.
    shipped.write_text(shipped.read_text() + "# changed\n")
    with pytest.raises(PluginError) as refused:
        load_source(source)
    message = str(refused.value)
    assert f"sha256 {source.short}" in message and "is not on" in message and "py_modules" in message
    assert source.module not in sys.modules


def test_plugins_are_given_on_the_command_line_as_any_list_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _user_file(tmp_path / "plug", "cli_listed_a")
    _user_file(tmp_path, "cli_listed_b")
    monkeypatch.chdir(tmp_path)
    try:
        listed = config_from_args(["plugins=[plug/cli_listed_a.py]", "algorithm.name=cli_listed_a"])
        single = config_from_args(["plugins=cli_listed_b.py", "algorithm.name=cli_listed_b"])
    finally:
        ALGORITHMS._items.pop("cli_listed_a", None)
        ALGORITHMS._items.pop("cli_listed_b", None)
    assert listed.plugins == ("plug/cli_listed_a.py",) and single.plugins == ("cli_listed_b.py",)
    assert (listed.algorithm.name, single.algorithm.name) == ("cli_listed_a", "cli_listed_b")


def test_a_method_in_a_module_travels_by_name_and_leaves_its_globals_behind(tmp_path: Path) -> None:
    """A module holding a 40 MB array: the config shipped with its code carries the module's name and digest, not
    the array."""
    body = USER_METHOD.replace(
        "class Client(GlobalModelClient):",
        "import numpy as np\nTABLE = np.ones(10_000_000, dtype=np.float32)  # 40 MB\n\n\n"
        "class Client(GlobalModelClient):\n    table = TABLE",
    )
    path = _user_file(tmp_path, "heavy_module_method", body)
    import_plugins([str(path)])
    try:
        config = RunConfig().override(tiny_overrides(tmp_path / "run", **{"algorithm.name": "heavy_module_method"}))
        blob = pickle.dumps(plugins.WithCode(config))
        assert len(blob) < 2**20, f"{len(blob)} bytes"
        carried = plugins.run_sources(config)
        assert [(s.file, s.kind) for s in carried] == [(str(path), "file")]
        assert pickle.loads(blob).config.algorithm.name == "heavy_module_method"
    finally:
        ALGORITHMS._items.pop("heavy_module_method", None)


def test_code_that_travels_by_value_keeps_its_file_and_lines(tmp_path: Path) -> None:
    """A notebook's or script's function, pickled by value: a traceback on another process names its file."""
    cell = types.ModuleType("by_value_cell")
    source = "def phases():\n    raise ValueError('boom')\n"
    exec(compile(source, str(tmp_path / "user_script.py"), "exec"), cell.__dict__)
    restored = pickle.loads(plugins._dumps(cell.phases))
    assert restored.__code__.co_filename == str(tmp_path / "user_script.py")
    assert restored.__code__.co_firstlineno == 1


_MAIN_WITH_A_LARGE_GLOBAL = """
import logging, pickle, sys
import numpy as np
sys.path.insert(0, {repo!r})
from tests.util.test_plugins import USER_METHOD
exec(USER_METHOD.replace("{{name}}", "main_heavy").replace(
    "class Client(GlobalModelClient):",
    "class Client(GlobalModelClient):\\n    def weight(self):\\n        return float(LOOKUP.sum())\\n"))
LOOKUP = np.ones(10_000_000, dtype=np.float32)  # 40 MB, used by the client's code
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
import rayfed
config = rayfed.RunConfig().override({{"algorithm.name": "main_heavy"}})
from rayfed.util.plugins import WithCode
print("BYTES", len(pickle.dumps(WithCode(config))))
"""


def test_a_method_defined_in_main_warns_naming_the_global_that_makes_its_payload_large(tmp_path: Path) -> None:
    script = tmp_path / "train_here.py"
    script.write_text(_MAIN_WITH_A_LARGE_GLOBAL.format(repo=str(REPO)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    size = int(done.stdout.split("BYTES", 1)[1].split()[0])
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert size > 40_000_000 and len(warnings) == 1, done.stderr[-2000:]
    assert "the global 'LOOKUP' of __main__ (38.1 MB)" in warnings[0] and "a module of its own" in warnings[0]


def test_a_source_record_is_data_that_round_trips(tmp_path: Path) -> None:
    source = locate(str(_user_file(tmp_path, "recorded_only")))
    assert PluginSource.from_record(json.loads(json.dumps(source.record()))) == source
    with pytest.raises(ValueError, match="kind is name, file or script"):
        PluginSource.from_record({**source.record(), "kind": "exec"})
    assert not any(
        os.path.basename(str(getattr(m, "__file__", ""))) == "recorded_only.py" for m in list(sys.modules.values())
    )


def test_a_config_pickles_as_plain_data_and_its_code_travels_beside_it_in_with_code() -> None:
    config = RunConfig()
    blob = pickle.dumps(config)
    assert b"rayfed.util.plugins" not in blob and pickle.loads(blob) == config
    shipped = pickle.dumps(plugins.WithCode(config))
    assert b"rayfed.util.plugins" in shipped and pickle.loads(shipped).config == config
