"""Ray actors: ``ClientWorker`` (trains batches of virtual clients) and ``ServerActor`` (owns the global state).

Both are thin shells over plain classes (:class:`rayfed.client_runner.ClientRunner`,
:class:`rayfed.server.Server`), so the logic is tested without a cluster.
:class:`WorkerPool` feeds the workers from the driver, :class:`RayExecutor` puts it all together.
"""

from rayfed.actors.client_worker import ClientWorker
from rayfed.actors.cluster import check_resources, default_num_workers, ray_session
from rayfed.actors.ray_executor import RayExecutor
from rayfed.actors.server_actor import ServerActor
from rayfed.actors.worker_pool import WorkerPool

__all__ = [
    "ClientWorker",
    "ServerActor",
    "WorkerPool",
    "RayExecutor",
    "ray_session",
    "check_resources",
    "default_num_workers",
]
