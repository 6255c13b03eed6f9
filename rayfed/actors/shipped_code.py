"""A run's code outside rayfed, sent to the nodes of a Ray cluster it joins, as Ray sends code.

The files of a run's own code (:func:`rayfed.util.plugins.run_sources`) are imported by name in every process
(:mod:`rayfed.util.plugin_sources`): on this machine, from where they are. A cluster that rayfed joins may have
nodes without them, so :func:`runtime_env_for` puts them in the runtime environment the driver joins with, as
``py_modules`` (a module's top-level package folder, or its one file): Ray uploads each once, content-addressed,
unpacks it on each node that runs the job's workers, caches it there and puts it on their path, where each
process finds it by its bytes. Left out: what is installed (site-packages: every node has its own), what the job
sends already (``ray job submit --working-dir``: the working directory), and a script run as ``__main__``
(its registrations travel by value). A job that sets ``py_modules`` itself keeps them, and is told what it must
include.
"""

from __future__ import annotations

import json
import logging
import os
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayfed.util.plugin_sources import PluginSource

logger = logging.getLogger(__name__)

__all__ = ["runtime_env_for"]

_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""The environment variable in which ``ray job submit`` hands its driver the job's config (runtime env included)."""


def _job_runtime_env() -> dict[str, Any]:
    try:
        return dict(json.loads(os.environ.get(_JOB_CONFIG, "{}")).get("runtime_env") or {})
    except (ValueError, AttributeError, TypeError):
        return {}


def _installed(path: Path) -> bool:
    places = {sysconfig.get_paths()[name] for name in ("purelib", "platlib")}
    return any(path.is_relative_to(place) for place in places)


def _shipped(source: PluginSource) -> Path:
    """What ``py_modules`` sends for ``source``: its top-level package's folder, or its one file."""
    file = Path(source.file)
    if source.kind != "name":
        return file
    top = source.module.split(".")[0]
    base = file.parent if file.name == "__init__.py" else file.with_suffix("")
    root = base.parents[source.module.count(".")]
    return root / top if (root / top).is_dir() else file


def runtime_env_for(sources: Sequence[PluginSource]) -> dict[str, Any]:
    """The runtime environment to join a cluster with so that its nodes hold ``sources`` (empty: nothing to add)."""
    job = _job_runtime_env()
    here = Path.cwd()
    shipped = [
        _shipped(source)
        for source in sources
        if source.kind != "script"
        and not _installed(Path(source.file))
        and not ("working_dir" in job and Path(source.file).is_relative_to(here))
    ]
    modules = list(dict.fromkeys(str(path) for path in shipped))
    if not modules:
        return {}
    if "py_modules" in job:
        logger.warning(
            "the job sets runtime_env py_modules itself, so rayfed does not add the run's code to them: include %s",
            ", ".join(modules),
        )
        return {}
    logger.info("sending the run's code to the cluster's nodes as runtime_env py_modules: %s", ", ".join(modules))
    return {"py_modules": modules}
