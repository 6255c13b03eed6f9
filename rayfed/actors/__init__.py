"""Ray actors: ``ClientWorker`` (trains batches of virtual clients) and ``ServerActor`` (owns the global state).

Both are thin shells over plain classes (:class:`rayfed.worker.ClientRunner`,
:class:`rayfed.server.Server`), so the logic is tested without a cluster.
"""

from rayfed.actors.client_worker import ClientWorker, WorkerPool
from rayfed.actors.cluster import check_resources, default_num_workers, ray_session
from rayfed.actors.ray_executor import RayExecutor
from rayfed.actors.server_actor import ServerActor

__all__ = [
    "ClientWorker",
    "ServerActor",
    "WorkerPool",
    "RayExecutor",
    "ray_session",
    "check_resources",
    "default_num_workers",
]
