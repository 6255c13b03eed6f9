"""Joining or starting Ray, and checking that the workers fit before anything is written.

* Inside ``ray job submit`` (``RAY_ADDRESS`` is set) or with ``engine.ray_address``,
  rayfed joins that cluster and leaves it running afterwards.
* Otherwise it starts a private local Ray with ``address="local"`` (never a stale
  cluster's address) and shuts it down at the end.
* If Ray is already initialised in this process (a notebook, a test, an Optuna trial
  running as a Ray task), it is used as it is.
* A cluster to join that does not answer is refused in seconds (:mod:`rayfed.actors.address`).

The dashboard, when started, binds to ``engine.dashboard_host`` (localhost by default). The
processes of a private Ray end with the driver, even one killed with SIGKILL
(:mod:`rayfed.util.reaper`).

Authentication: a private local Ray is started with token authentication off
(``RAY_AUTH_MODE=disabled``, unless the environment already sets ``RAY_AUTH_MODE``). It
belongs to this one run, binds its services to this machine and is shut down with the
run, so a token would guard nothing the user's own account could not already reach, and
Ray would print its token-authentication warning on every run. A cluster that rayfed
joins keeps whatever authentication it was started with: rayfed leaves it untouched.

Workers that do not fit would wait forever for a CPU or a GPU, so the fit is checked
first (:func:`check_resources`): for a private local Ray against this machine, before
Ray starts (:func:`local_node`); for any other Ray against its alive nodes
(:func:`cluster_nodes`). A worker is one bundle of ``engine.num_cpus_per_worker`` CPUs
and ``engine.num_gpus_per_worker`` GPUs that Ray places on a single node, so a node
holds ``min(floor(cpus / cpus_per_worker), floor(gpus / gpus_per_worker))`` workers and
the cluster the sum over its nodes. A cluster that is short is refused at once, unless
``engine.resource_wait_s`` > 0: then rayfed asks Ray's autoscaler for the missing
workers (``ray.autoscaler.sdk.request_resources``, a no-op without an autoscaler), says
so, and waits up to that many seconds for nodes to join before refusing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import ray

from rayfed.actors.address import check_reachable, not_joined
from rayfed.actors.job_agent import missing_job_agent
from rayfed.actors.shipped_code import runtime_env_for
from rayfed.config import EngineConfig
from rayfed.util.errors import ResourceError
from rayfed.util.plugin_sources import PluginSource
from rayfed.util.processes import children
from rayfed.util.reaper import Reaper

logger = logging.getLogger(__name__)

__all__ = [
    "ray_session",
    "ray_started",
    "PRIVATE_CLUSTER_ENV",
    "UNWATCHED_CLUSTER_ENV",
    "local_node",
    "cluster_nodes",
    "alive_node_ids",
    "workers_on",
    "check_fit",
    "check_resources",
    "pool_target",
    "ask_for_workers",
]

Node = Mapping[str, float]
"""One node's total resources, as Ray names them (``"CPU"``, ``"GPU"``)."""

_POLL_S = 1.0
"""How often the fit is re-checked while waiting for an autoscaler."""


@contextmanager
def ray_session(engine: EngineConfig, code: Sequence[PluginSource] = ()) -> Iterator[None]:
    """Make sure Ray is initialised for the body; shut down only what was started here. A cluster joined here
    receives ``code``, the files of the run's code outside rayfed, in the job's runtime environment
    (:func:`~rayfed.actors.shipped_code.runtime_env_for`); a private Ray's workers find them where they are."""
    address = _address(engine)
    if address:
        runtime_env = runtime_env_for(code) if not ray.is_initialized() else {}
        options: dict[str, object] = {"runtime_env": runtime_env} if runtime_env else {}
    else:
        options = {"include_dashboard": engine.dashboard, "dashboard_host": engine.dashboard_host}
    with ray_started(address, source=_source(engine), **options):
        yield


PRIVATE_CLUSTER_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_preload_python_modules": "rayfed.actors.server_actor",
}
"""The environment a private local Ray starts with, where the user has not set these variables: no
token authentication (module docstring), and worker processes that import the ``ServerActor``'s
modules (Ray, numpy, the config and the algorithm contract, not torch) as Ray starts them. Ray
preloads the same modules into every worker, the ``ServerActor``'s included, so torch is not
among them: a ClientWorker imports it when it is placed, and the server of an algorithm whose
module does without torch (FedAvg, FedAdam, L-DAWA) runs in a process ~300 MB smaller.
Preloading torch as well did not start runs sooner (benchmarks/README.md, "Whole runs")."""

UNWATCHED_CLUSTER_ENV = {
    "RAY_task_events_report_interval_ms": "0",
    "RAY_enable_metrics_collection": "0",
}
"""What a private local Ray without a dashboard would record for no one, off where the user has not set these
variables: every task's state changes, sent to the GCS for the dashboard and the state API, and the metrics its
processes export for Prometheus. Off, its GCS and dashboard agent take about 10 ms less CPU a round of
``benchmarks/throughput.py`` (benchmarks/README.md, "Throughput")."""


@contextmanager
def ray_started(address: str | None, *, source: str = "RAY_ADDRESS", **options: object) -> Iterator[None]:
    """Ray for the body: the one already initialised in this process, the cluster at ``address``, or a
    private local Ray (``options`` go to ``ray.init`` either way) with :data:`PRIVATE_CLUSTER_ENV` (and, without a
    dashboard, :data:`UNWATCHED_CLUSTER_ENV`). Whatever is started here is shut down at the end, and the environment
    is restored. An ``address`` (the value of the
    setting ``source``) where no cluster answers is refused (:func:`~rayfed.actors.address.check_reachable`).

    A private Ray's processes are watched by a :class:`~rayfed.util.reaper.Reaper`, so that they end
    within seconds of this process however it ends (killed, out of memory), not a minute later."""
    if ray.is_initialized():
        yield
        return
    target = check_reachable(address, source) if address else None  # "auto" resolved as rayfed documents it
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    private = {} if address else dict(PRIVATE_CLUSTER_ENV)
    if not address and not options.get("include_dashboard"):
        private.update(UNWATCHED_CLUSTER_ENV)
    own = {k: v for k, v in private.items() if k not in os.environ}
    os.environ.update(own)  # for the cluster started here, while it runs
    reaper = None
    try:
        if address:
            try:
                ray.init(address=target, logging_level=logging.WARNING, **options)  # type: ignore[arg-type]
            except ConnectionError as error:  # it accepted the connection, but is not a cluster's head
                raise not_joined(address, source, error) from None
            _say_joined(f"{source}={address!r}", address if target is None else target)
        else:
            reaper = Reaper()
            before = set(children(frozenset({os.getpid()})))
            _start_private(options)
            reaper.watch(set(children(frozenset({os.getpid()}))) - before - {reaper.pid})
        yield
    finally:
        ray.shutdown()
        if reaper is not None:
            reaper.stop()
        for key in own:
            del os.environ[key]


def _start_private(options: dict[str, object]) -> None:
    """``ray.init`` of a private local Ray; ResourceError with the fix where it times out starting (on a machine
    too busy for Ray's processes to come up in the 30 s Ray gives them), instead of Ray's traceback."""
    try:
        ray.init(address="local", logging_level=logging.WARNING, **options)  # type: ignore[arg-type]
    except Exception as error:  # Ray raises a bare Exception when its node times out starting
        said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if "timed out" not in said:
            raise
        raise ResourceError(
            f"a private Ray could not start on this machine (Ray: {said}), which happens when the machine is too "
            "busy for Ray's processes to start within the 30 s Ray waits; run the command again when it is less "
            "busy, with fewer workers (engine.num_workers=1), or in this process with engine.backend=local"
        ) from None


def _say_joined(setting: str, target: str) -> None:
    """Log what a run joined: the address, the setting that named it, the alive nodes with their CPUs and GPUs;
    and warn when the cluster's head cannot take ``ray job submit`` (:mod:`rayfed.actors.job_agent`)."""
    nodes = cluster_nodes()
    cpus, gpus = (sum(float(node.get(kind, 0.0)) for node in nodes) for kind in ("CPU", "GPU"))
    held = f"{len(nodes)} node{'' if len(nodes) == 1 else 's'}, {cpus:g} CPUs, {gpus:g} GPUs"
    logger.info("joined the Ray cluster at %s (%s): %s", target, setting, held)
    agentless = None if target.startswith("ray://") else missing_job_agent()
    if agentless:
        logger.warning("%s", agentless)


def _address(engine: EngineConfig) -> str | None:
    """The Ray cluster to join, or None to start a private local Ray."""
    return engine.ray_address or os.environ.get("RAY_ADDRESS")


def _source(engine: EngineConfig) -> str:
    """The setting that names the cluster to join."""
    return "engine.ray_address" if engine.ray_address else "RAY_ADDRESS"


def local_node() -> list[Node]:
    """The resources a private ``ray.init(address="local")`` will find on this machine."""
    import torch
    from ray._private.utils import get_num_cpus  # Ray's own count: CPU affinity and cgroup quotas

    return [{"CPU": float(get_num_cpus()), "GPU": float(torch.cuda.device_count())}]


def cluster_nodes() -> list[Node]:
    """The total resources of every alive node of the Ray cluster this process is connected to."""
    return [node["Resources"] for node in ray.nodes() if node.get("Alive")]


def alive_node_ids() -> set[str]:
    """The ids of the alive nodes of the Ray cluster this process is connected to."""
    return {node["NodeID"] for node in ray.nodes() if node.get("Alive")}


def workers_on(nodes: Sequence[Node], engine: EngineConfig) -> int:
    """How many workers (one bundle of CPUs and GPUs each, placed on one node) ``nodes`` hold."""
    total = 0
    for node in nodes:
        fits = int(float(node.get("CPU", 0.0)) // engine.num_cpus_per_worker)
        if engine.num_gpus_per_worker > 0:
            fits = min(fits, int(float(node.get("GPU", 0.0)) // engine.num_gpus_per_worker))
        total += fits
    return total


def check_fit(engine: EngineConfig, nodes: Sequence[Node], where: str) -> None:
    """Refuse ``engine`` if its workers cannot all be placed on ``nodes`` (``where`` names them in the message)."""
    cpw, gpw = engine.num_cpus_per_worker, engine.num_gpus_per_worker
    cpus = [float(n.get("CPU", 0.0)) for n in nodes]
    gpus = [float(n.get("GPU", 0.0)) for n in nodes]
    if gpw > 0 and max(gpus, default=0.0) == 0:
        raise ResourceError(
            f"engine.num_gpus_per_worker={gpw:g} but {where} has no GPUs; set engine.num_gpus_per_worker=0 to "
            "train on CPUs"
        )
    for field, per_worker, amounts, unit in (("cpus", cpw, cpus, "CPUs"), ("gpus", gpw, gpus, "GPUs")):
        if per_worker > max(amounts, default=0.0):
            raise ResourceError(
                f"engine.num_{field}_per_worker={per_worker:g} exceeds the {max(amounts, default=0.0):g} {unit} of "
                f"the largest node of {where}; one worker runs on one node, so set engine.num_{field}_per_worker "
                f"to at most {max(amounts, default=0.0):g}"
            )
    fits = workers_on(nodes, engine)
    asked = max(1, engine.num_workers)
    if asked > fits:
        need = f"{asked * cpw:g} CPUs (engine.num_cpus_per_worker={cpw:g} each)"
        if gpw > 0:
            need += f" and {asked * gpw:g} GPUs (engine.num_gpus_per_worker={gpw:g} each)"
        raise ResourceError(
            f"engine.num_workers={engine.num_workers} asks for {asked} workers, which need {need}, but {where} has "
            f"{sum(cpus):g} CPUs and {sum(gpus):g} GPUs, room for {fits} workers; set engine.num_workers to at "
            "most that (0 = as many as fit) or lower the per-worker resources"
        )


def check_resources(engine: EngineConfig) -> None:
    """Refuse, before any actor is created, workers that Ray could never place (they would wait forever).

    Before Ray is initialised, a private Ray still to be started here is checked against
    this machine (Ray is not started just to refuse) and a cluster still to be joined is
    knocked on (:func:`~rayfed.actors.address.check_reachable`); once Ray is initialised,
    its alive nodes are. With
    ``engine.resource_wait_s`` > 0 a short cluster is first asked to scale up and given
    that long to do so.
    """
    if not ray.is_initialized():
        address = _address(engine)
        if address:
            check_reachable(address, _source(engine))
        else:
            check_fit(engine, local_node(), "this machine")
        return
    try:
        check_fit(engine, cluster_nodes(), "the Ray cluster")
    except ResourceError:
        if engine.resource_wait_s <= 0:
            raise
        _wait_for_autoscaler(engine)


def _wait_for_autoscaler(engine: EngineConfig) -> None:
    logger.warning(
        "the Ray cluster cannot hold the workers yet; %s, waiting up to engine.resource_wait_s=%g s",
        ask_for_workers(engine),
        engine.resource_wait_s,
    )
    deadline = time.monotonic() + engine.resource_wait_s
    while True:
        try:
            check_fit(engine, cluster_nodes(), "the Ray cluster")
            return
        except ResourceError as e:
            if time.monotonic() >= deadline:
                raise ResourceError(f"{e} (after waiting engine.resource_wait_s={engine.resource_wait_s:g} s)") from e
        time.sleep(_POLL_S)


def ask_for_workers(engine: EngineConfig) -> str:
    """Ask Ray's autoscaler (a no-op without one) for the pool's workers; say what was asked for."""
    from ray.autoscaler.sdk import request_resources

    bundle = {"CPU": engine.num_cpus_per_worker}
    if engine.num_gpus_per_worker > 0:
        bundle["GPU"] = engine.num_gpus_per_worker
    count = max(1, engine.num_workers or engine.max_workers)
    request_resources(bundles=[bundle] * count)
    shape = " and ".join(f"{amount:g} {name}" for name, amount in bundle.items())
    return f"asked the autoscaler for {count} worker(s) of {shape} each"


def pool_target(engine: EngineConfig) -> int:
    """How many workers the pool should have now: ``engine.num_workers`` (else every worker the alive nodes
    hold, up to ``engine.max_workers``), but never more than those nodes hold."""
    return engine.workers_for(workers_on(cluster_nodes(), engine))
