"""Joining or starting Ray, and checking resources before any actor is created.

* Inside ``ray job submit`` (``RAY_ADDRESS`` is set) or with ``engine.ray_address``,
  rayfed joins that cluster and leaves it running afterwards.
* Otherwise it starts a private local Ray with ``address="local"`` (never a stale
  cluster's address) and shuts it down at the end.
* If Ray is already initialised in this process (a notebook, a test, an Optuna trial
  running as a Ray task), it is used as it is.

The dashboard, when started, binds to ``engine.dashboard_host`` (localhost by default).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from rayfed.config import EngineConfig
from rayfed.errors import ResourceError

logger = logging.getLogger(__name__)

__all__ = ["ray_session", "check_resources", "default_num_workers"]


@contextmanager
def ray_session(engine: EngineConfig) -> Iterator[None]:
    """Make sure Ray is initialised for the body; shut down only what was started here."""
    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = engine.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        logger.info("joining the Ray cluster at %s", address)
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        ray.init(
            address="local",
            include_dashboard=engine.dashboard,
            dashboard_host=engine.dashboard_host,
            logging_level=logging.WARNING,
        )
    try:
        yield
    finally:
        ray.shutdown()


def check_resources(engine: EngineConfig) -> None:
    """Fail before creating actors that could never be scheduled (they would wait forever)."""
    total = ray.cluster_resources()
    gpus = float(total.get("GPU", 0.0))
    if engine.num_gpus_per_worker > 0 and gpus == 0:
        raise ResourceError(
            f"engine.num_gpus_per_worker={engine.num_gpus_per_worker:g} but the Ray cluster has no GPUs; "
            "set engine.num_gpus_per_worker=0 to train on CPUs"
        )
    if engine.num_gpus_per_worker > gpus > 0:
        raise ResourceError(
            f"engine.num_gpus_per_worker={engine.num_gpus_per_worker:g} exceeds the cluster's {gpus:g} GPUs"
        )
    cpus = float(total.get("CPU", 0.0))
    if engine.num_cpus_per_worker > cpus:
        raise ResourceError(
            f"engine.num_cpus_per_worker={engine.num_cpus_per_worker:g} exceeds the cluster's {cpus:g} CPUs"
        )


def default_num_workers(engine: EngineConfig) -> int:
    """``engine.num_workers``, or as many workers as the cluster's CPUs (and GPUs) allow."""
    if engine.num_workers:
        return engine.num_workers
    total = ray.cluster_resources()
    count = int(float(total.get("CPU", 1.0)) // engine.num_cpus_per_worker)
    if engine.num_gpus_per_worker > 0:
        count = min(count, int(float(total.get("GPU", 0.0)) // engine.num_gpus_per_worker))
    return max(1, count)
