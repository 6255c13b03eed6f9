"""The server process imports only what its server half needs: FedAvg's never imports torch.

Ray builds the ``ServerActor`` in a fresh worker process from pickled arguments (config, problem
spec, initial state); ``import torch`` alone costs such a process about 300 MB. The subprocess
below does what that worker does: it imports the actor's module, unpickles the arguments and
runs the server through a round, then reports which heavy modules it imported.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from rayfed import RunConfig
from rayfed.algorithms import resolve
from rayfed.engine.inputs import RunInputs
from rayfed.util.plugins import WithCode
from tests.conftest import tiny_overrides

_SERVER_PROCESS = """
import json, pickle, sys
import numpy as np
import rayfed.actors.server_actor
from rayfed.execution.round_facts import RoundFacts
from rayfed.execution.server import Server

shipped, spec, initial = pickle.loads(open(sys.argv[1], "rb").read())
server = Server(shipped.config, spec, initial)
broadcast = server.broadcast()
ctx = RoundFacts(round=0, seed=0, lr=0.1, sampled=np.arange(2))
server.aggregate(ctx, None)
print(json.dumps({"torch": "torch" in sys.modules, "broadcast": type(broadcast).__name__}))
"""


@pytest.mark.parametrize(("algorithm", "torch_expected"), [("fedavg", False), ("fedadam", False), ("fedprox", True)])
def test_the_server_process_imports_torch_only_for_a_server_half_that_needs_it(
    algorithm: str, torch_expected: bool, tmp_path: Path
) -> None:
    # Prepare: the server's arguments, pickled as Ray sends them.
    config = RunConfig().override(tiny_overrides(tmp_path / "run", **{"algorithm.name": algorithm}))
    inputs = RunInputs.prepare(config, resolve(config.algorithm), tmp_path / "run", continues=False)
    arguments = tmp_path / "server_arguments.pkl"
    arguments.write_bytes(pickle.dumps((WithCode(config), inputs.spec, inputs.initial)))
    # Execute
    done = subprocess.run(
        [sys.executable, "-c", _SERVER_PROCESS, str(arguments)], capture_output=True, text=True, check=True
    )
    # Assert: FedProx's module trains with torch at its top; FedAvg's and FedAdam's are numpy only.
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["torch"] is torch_expected
    assert report["broadcast"]


def _numpy_only_method(name: str) -> str:
    """The tests' user method (tests/util/test_plugins.py), with torch imported only where its client trains."""
    from tests.util.test_plugins import USER_METHOD

    lazily = "        from rayfed.train.phase import Phase\n\n"
    body = USER_METHOD.replace("from rayfed.algorithms.common.proximal import proximal_term\n", "")
    body = body.replace("from rayfed.train.phase import Phase\n", "")
    body = body.replace("        return [Phase(", lazily + "        return [Phase(")
    body = body.replace(
        "        return proximal_term(",
        "        from rayfed.algorithms.common.proximal import proximal_term\n\n        return proximal_term(",
    )
    return body.replace("{name}", name)


@pytest.mark.parametrize(("top_import", "torch_expected"), [("", False), ("import torch\n", True)])
def test_a_plugin_servers_process_runs_its_modules_top_level_and_imports_torch_only_if_that_does(
    top_import: str, torch_expected: bool, tmp_path: Path
) -> None:
    """A user's module is imported by name in the server's process too: what its top level imports comes along,
    and nothing its client half needs only where it trains."""
    from rayfed.algorithms import ALGORITHMS
    from rayfed.util.plugin_sources import import_plugins

    name = f"server_side_method_{int(torch_expected)}"
    path = tmp_path / "code" / f"{name}.py"
    path.parent.mkdir()
    path.write_text(top_import + _numpy_only_method(name))
    import_plugins([str(path)])
    try:
        config = RunConfig().override(tiny_overrides(tmp_path / "run", **{"algorithm.name": name}))
        inputs = RunInputs.prepare(config, resolve(config.algorithm), tmp_path / "run", continues=False)
        arguments = tmp_path / "server_arguments.pkl"
        arguments.write_bytes(pickle.dumps((WithCode(config), inputs.spec, inputs.initial)))
    finally:
        ALGORITHMS._items.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", _SERVER_PROCESS, str(arguments)], capture_output=True, text=True, check=True
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["torch"] is torch_expected and report["broadcast"]
