"""A joined cluster whose head has no job agent (another Ray on that machine holds the agent's port) is named in
one warning with the fix, since a job submitted to it never starts and no rayfed code could say it there."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from rayfed.actors import job_agent

HEAD = {"NodeID": "ab12", "Alive": True, "NodeManagerAddress": "10.0.0.5", "Resources": {"node:__internal_head__": 1.0}}
WORKER = {"NodeID": "cd34", "Alive": True, "NodeManagerAddress": "10.0.0.6", "Resources": {"CPU": 8.0}}


@dataclass
class Agents:
    """The nodes whose dashboard agent recorded its HTTP address, and the nodes asked about, in order."""

    recorded: set[str] = field(default_factory=set)
    asked: list[str] = field(default_factory=list)

    def __call__(self, node_id: str) -> bool:
        self.asked.append(node_id)
        return node_id in self.recorded


@pytest.fixture
def agents(monkeypatch: pytest.MonkeyPatch) -> Agents:
    """A joined cluster of a worker node and a head node, whose agents' records the test sets."""
    pytest.importorskip("aiohttp")  # Ray's dashboard, which the job API needs
    agents = Agents()
    monkeypatch.setattr("ray.nodes", lambda: [WORKER, HEAD])
    monkeypatch.setattr(job_agent, "_agent_recorded", agents)
    monkeypatch.setattr(job_agent, "_POLL_S", 0.01)
    return agents


def test_a_head_without_a_job_agent_is_named_with_the_port_and_the_flag(agents: Agents) -> None:
    warning = job_agent.missing_job_agent(grace_s=0.05)

    assert warning is not None and "\n" not in warning
    assert warning.startswith("the Ray cluster's head node (10.0.0.5) has no job agent")
    assert "another Ray on that machine holds the agent's port (52365 unless set otherwise" in warning
    assert "fails with 'No available agent to submit job'" in warning
    assert "`ray start --head --dashboard-agent-listen-port=0`" in warning
    assert set(agents.asked) == {"ab12"}  # the head's agent only: the job API asks no other


def test_a_head_whose_agent_recorded_its_address_is_let_through_at_once(agents: Agents) -> None:
    agents.recorded.add("ab12")

    assert job_agent.missing_job_agent(grace_s=60) is None
    assert agents.asked == ["ab12"]  # asked once: no waiting on a head that has its agent
