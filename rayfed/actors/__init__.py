"""Ray actors: ``ClientWorker`` (trains batches of virtual clients) and ``ServerActor`` (owns the global state).

Both are thin shells over plain classes (:class:`rayfed.execution.client_runner.ClientRunner`,
:class:`rayfed.execution.server.Server`), so the logic is tested without a cluster.
:class:`WorkerPool` feeds the workers from the driver, :class:`RayExecutor` puts it all together.

The names are imported on first use (:mod:`rayfed.util.lazy`): the process that hosts the
``ServerActor`` imports this package to find the actor's class, and must not import torch
through the ``ClientWorker`` when its server half does not need it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayfed.util.lazy import lazy_exports

if TYPE_CHECKING:  # the same names for type checkers; at run time __getattr__ imports them
    from rayfed.actors.client_worker import ClientWorker  # noqa: F401
    from rayfed.actors.cluster import check_resources, ray_session  # noqa: F401
    from rayfed.actors.ray_executor import RayExecutor  # noqa: F401
    from rayfed.actors.server_actor import ServerActor  # noqa: F401
    from rayfed.actors.worker_pool import WorkerPool  # noqa: F401

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "rayfed.actors.client_worker": ("ClientWorker",),
        "rayfed.actors.server_actor": ("ServerActor",),
        "rayfed.actors.worker_pool": ("WorkerPool",),
        "rayfed.actors.ray_executor": ("RayExecutor",),
        "rayfed.actors.cluster": ("ray_session", "check_resources"),
    },
)
