"""A user's method in a user's module reaches Ray's processes by name: every process imports the module (its
top level runs there, its globals are made there, not sent), the config crosses as its name and digest, and a
mistake in it names the user's file, line and source line from the worker that ran it.

The session's Ray was started from the repository, so a module in a test's folder is on no worker's path: the
workers import it from the file the driver recorded, checked by its digest.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rayfed
from rayfed import RunConfig
from rayfed.algorithms import ALGORITHMS
from rayfed.util import plugins
from rayfed.util.plugin_sources import import_plugins
from tests.conftest import tiny_overrides
from tests.util.test_plugins import USER_METHOD, _user_file


def _rounds(run_dir: Path) -> str:
    rows = pq.read_table(run_dir / "rounds.parquet").to_pylist()
    return json.dumps([{k: v for k, v in r.items() if not k.endswith(("_s", "_seconds"))} for r in rows])


@pytest.mark.timeout(300)
def test_a_method_in_a_module_with_a_40_mb_global_runs_on_ray_with_two_workers_with_the_numbers_of_local(
    ray_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray.cloudpickle

    # Prepare: a module whose client refers to a 40 MB array made at its top level.
    body = USER_METHOD.replace(
        "class Client(GlobalModelClient):",
        "import numpy as np\nLOOKUP = np.full(10_000_000, 0.5, dtype=np.float32)  # 40 MB\n\n\n"
        "class Client(GlobalModelClient):\n    lookup = LOOKUP",
    )
    import_plugins([str(_user_file(tmp_path / "code", "big_global_method", body))])
    try:
        runs = {
            backend: RunConfig().override(
                tiny_overrides(
                    tmp_path / backend,
                    **{"algorithm.name": "big_global_method", "engine.backend": backend, "engine.num_workers": 2},
                )
            )
            for backend in ("local", "ray")
        }
        # Execute: each backend's run, counting the times the Ray run's config is pickled.
        packed: list[int] = []
        pack = plugins.pack
        monkeypatch.setattr(plugins, "pack", lambda fields: packed.append(1) or pack(fields))
        for config in runs.values():
            rayfed.run(config)
        pickled = len(packed)
        size = len(pickle.dumps(plugins.WithCode(runs["ray"])))
    finally:
        ALGORITHMS._items.pop("big_global_method", None)
    # Check: the config pickles small, once for the run's 2 workers and server (the local run never); Ray
    # registered no module by value; the numbers are local's.
    assert size < 2**20 and pickled == 1
    assert not ray.cloudpickle.cloudpickle._PICKLE_BY_VALUE_MODULES
    assert _rounds(tmp_path / "local") == _rounds(tmp_path / "ray")


@pytest.mark.timeout(300)
def test_a_users_exception_on_a_ray_worker_names_their_file_line_and_source_line(ray_cluster, tmp_path: Path) -> None:
    body = USER_METHOD.replace(
        "        return [Phase(epochs=job.train.local_epochs, loss=self.term)]",
        "        raise ValueError('a mistake of the method author')",
    )
    path = _user_file(tmp_path / "code", "mistaken_method", body)
    line = path.read_text().splitlines().index("        raise ValueError('a mistake of the method author')") + 1
    import_plugins([str(path)])
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run", **{"algorithm.name": "mistaken_method", "engine.backend": "ray", "engine.num_workers": 1}
        )
    )
    try:
        with pytest.raises(ValueError) as raised:
            rayfed.run(config)
    finally:
        ALGORITHMS._items.pop("mistaken_method", None)
    text = str(raised.value)
    assert f'File "{path}", line {line}, in phases' in text, text[-3000:]
    assert "raise ValueError('a mistake of the method author')" in text and "<dynamic-code>" not in text
