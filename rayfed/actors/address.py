"""The address of a Ray cluster to join, knocked on before ``ray.init`` is given it.

``ray.init(address=...)`` retries an address where no cluster answers for minutes (13 min 45 s for a closed
port on Ray 2.60, measured), printing a warning every few seconds, then raises a ``ConnectionError``; it waits
in C++, where neither Ctrl-C nor SIGTERM reaches it. :func:`check_reachable` opens a TCP connection to the
address first: a closed port or an unknown host is refused in milliseconds, a host that does not answer after
:data:`CONNECT_S` seconds, each with one line naming the setting, its value and the fix, and a signal ends the
knock at once (Python's socket calls run its handlers). A port that accepts the connection is then asked, as
``ray.init`` asks first, for the cluster's id (one gRPC call, bounded by :data:`CONNECT_S` and woken by
signals): a server there that is no Ray head (a web server, the dashboard's port 8265) is refused in
milliseconds too, where ``ray.init`` would wait on it without end.

``"auto"`` means what this module promises and nothing more: the cluster ``ray start`` started last on this
machine, whose address Ray records in ``ray_current_cluster`` in its temp folder (``/tmp/ray`` unless
``RAY_TMPDIR`` names another; ``ray stop`` removes it). With no such record ``"auto"`` is refused in one line:
Ray's own ``"auto"`` would then join any Ray running on the machine, another user's private one included.
:func:`check_reachable` returns the address it resolved, which is what ``ray.init`` is given.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

from rayfed.util.errors import ResourceError

__all__ = ["CONNECT_S", "check_reachable", "started_last", "not_joined"]

CONNECT_S = 5.0
"""Seconds a cluster's address is given to accept a connection before the run is refused."""


def check_reachable(address: str, source: str = "engine.ray_address") -> str:
    """Refuse ``address`` (the value of the setting ``source``) when no Ray cluster's head can answer there:
    it is not ``HOST:PORT``, its host is unknown, its port closed, or nothing answers within :data:`CONNECT_S`
    seconds. ``"auto"`` is the cluster ``ray start`` started last on this machine (:func:`started_last`) and
    ``ray://HOST:PORT`` a Ray Client server; both are knocked on the same way. Returns the address to join:
    ``address``, or for ``"auto"`` the one it stands for. Raises ResourceError; nothing is started."""
    target = started_last(source) if address == "auto" else address
    setting = _setting(address, source, target)
    host, port = _host_port(target, setting, source)
    try:
        socket.create_connection((host, port), timeout=CONNECT_S).close()
    except OSError as error:
        why = f"no answer in {CONNECT_S:g} s" if isinstance(error, TimeoutError) else _reason(error)
        raise ResourceError(f"{setting}: no Ray cluster answers at {host}:{port} ({why}); {_fix(source)}") from None
    why_not = None if target.startswith("ray://") or os.environ.get("RAY_USE_TLS") else _not_a_head(host, port)
    if why_not:
        raise ResourceError(
            f"{setting}: {host}:{port} answers, but not as a Ray cluster's head ({why_not}); "
            f"give the head's GCS address (ray start --head prints it; port 6379 by default), or {_local(source)}"
        )
    return target


def started_last(source: str = "engine.ray_address") -> str:
    """The address of the cluster ``ray start`` started last on this machine, as Ray recorded it; ResourceError
    naming the record's file when there is none (no such cluster runs, or ``ray stop`` ended it)."""
    from ray._common.utils import get_ray_address_file
    from ray._private.utils import read_ray_address

    recorded = read_ray_address(None)
    if not recorded:
        raise ResourceError(
            f"{_setting('auto', source)} means the cluster `ray start` started last on this machine, but none is "
            f"recorded ({get_ray_address_file(None)} does not exist); other Ray instances here, such as another "
            f"user's private one, are never joined. Start one with `ray start --head`, give a cluster's HOST:PORT, "
            f"or {_local(source)}"
        )
    return recorded


def _not_a_head(host: str, port: int) -> str | None:
    """Why the server at ``host:port`` is not a Ray head's GCS, or None if it answered the cluster-id request as
    one does (a Ray Client server, ``ray://``, and a TLS cluster are not asked: they answer otherwise)."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(),  # type: ignore[attr-defined]  # protobuf-made
                timeout=CONNECT_S,
            )
        except grpc.RpcError as error:
            code = error.code()  # a call's error is also its grpc.Call
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return f"no answer to a Ray request in {CONNECT_S:g} s"
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED):
                details = str(error.details() or code.name)
                return details.split("; last error: ")[-1][:120]
    return None  # answered, or refused as a Ray head refuses (its authentication): ray.init says the rest


def not_joined(address: str, source: str, error: Exception) -> ResourceError:
    """The error for an address that accepted the connection but did not answer as a Ray cluster's head."""
    return ResourceError(f"{_setting(address, source)}: {error}; {_fix(source)}")


def _host_port(address: str, setting: str, source: str) -> tuple[str, int]:
    """The host and port ``address`` names (the value ``setting`` gives, or stands for)."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = None
    if not parts.hostname or port is None:
        raise ResourceError(
            f"{setting} is not a cluster's address: give its head's HOST:PORT (ray start --head prints it; port "
            f"6379 by default), ray://HOST:PORT for Ray Client, or {_local(source)}"
        )
    return parts.hostname, port


def _reason(error: OSError) -> str:
    if isinstance(error, socket.gaierror):
        return "unknown host"
    return (error.strerror or str(error)).lower()


def _setting(address: str, source: str, target: str | None = None) -> str:
    """How a message names the setting, its value and, for ``"auto"``, the address it stood for."""
    named = f"{source}={address!r}" + (" (from the environment)" if source == "RAY_ADDRESS" else "")
    if target is not None and target != address:
        named += f" (the cluster `ray start` started last, at {target})"
    return named


def _fix(source: str) -> str:
    """How to go on: with the cluster, or without it."""
    return f"start that cluster, give the address of a running one, or {_local(source)}"


def _local(source: str) -> str:
    """How to run without the cluster that ``source`` names."""
    without = "unset RAY_ADDRESS" if source == "RAY_ADDRESS" else f"set {source}= (empty)"
    return f"{without} to run on a private local Ray"
