"""Whether a joined Ray cluster can take ``ray job submit``: the job agent on its head node.

``ray job submit`` hands each job to the job agent on the cluster's head node, part of Ray's dashboard agent,
which serves HTTP on port 52365 unless ``ray start --dashboard-agent-listen-port`` names another. When that
port is taken, by another Ray on the same machine (any private ``ray.init``: another user's, a test session's,
a rayfed run's), the agent stays up without HTTP and records no address: every submission then fails with
Ray's "No available agent to submit job, please try again later", and only the agent's log
(``dashboard_agent.log``) says why. Such a job never starts, so no rayfed code runs in it; rayfed looks when it
joins a cluster instead (:func:`missing_job_agent`), and names the cause and the fix there in one line.
"""

from __future__ import annotations

import importlib.util
import time

import ray

__all__ = ["AGENT_PORT", "GRACE_S", "missing_job_agent"]

AGENT_PORT = 52365
"""The port Ray's dashboard agent serves HTTP on unless ``ray start --dashboard-agent-listen-port`` names another
(Ray's ``DEFAULT_DASHBOARD_AGENT_LISTEN_PORT``)."""

GRACE_S = 10.0
"""How long a head whose agent has not recorded its address yet (a cluster started a moment ago) is given."""

_POLL_S = 0.5
_HEAD = "node:__internal_head__"
"""The resource Ray gives the head node alone (``ray._common.constants.HEAD_NODE_RESOURCE_NAME``)."""


def missing_job_agent(grace_s: float = GRACE_S) -> str | None:
    """One line naming the cause and the fix when the cluster this process joined has no job agent on its head
    node after ``grace_s`` seconds, else None. Ray without its dashboard (no ``aiohttp``: no job API at all) and
    a cluster without a head node in sight are not asked."""
    if importlib.util.find_spec("aiohttp") is None:
        return None
    head = next((n for n in ray.nodes() if n.get("Alive") and _HEAD in n.get("Resources", {})), None)
    if head is None:
        return None
    deadline = time.monotonic() + grace_s
    while not _agent_recorded(str(head["NodeID"])):
        if time.monotonic() >= deadline:
            return (
                f"the Ray cluster's head node ({head.get('NodeManagerAddress', '?')}) has no job agent: its dashboard "
                "agent serves no HTTP, as when another Ray on that machine holds the agent's port "
                f"({AGENT_PORT} unless set otherwise; Ray's dashboard_agent.log names it), so `ray job submit` to this "
                "cluster fails with 'No available agent to submit job'; start the head with `ray start --head "
                "--dashboard-agent-listen-port=0` (a free port of the system's choosing) to submit jobs to it"
            )
        time.sleep(_POLL_S)
    return None


def _agent_recorded(node_id: str) -> bool:
    """Whether the dashboard agent of node ``node_id`` recorded its HTTP address, where the job API looks for it."""
    from ray.experimental.internal_kv import _internal_kv_get

    key = f"DASHBOARD_AGENT_ADDR_NODE_ID_PREFIX:{node_id}"  # ray.dashboard.consts, in Ray's dashboard namespace
    return _internal_kv_get(key, namespace="dashboard") is not None
