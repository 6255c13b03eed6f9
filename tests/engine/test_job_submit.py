"""``ray job submit`` runs the 1,000-client example on a running cluster, which it joins, and a user's own method
registered in the submitted script (``examples/own_method.py``), whose workers know it without rayfed's help.

A separate process holds a private one-node cluster with a dashboard (the job API lives
there) on free ports, so the session's ``ray_cluster`` fixture and other Ray instances on
the machine are never touched; the test ends that process, and with it the cluster, by
its id. The example is submitted with the ``ray`` CLI exactly as README.md shows it,
with 2 rounds on small data; the job's output and run files are checked, and so is what
was uploaded (no ``.venv``, ``.git`` or old runs).
"""

from __future__ import annotations

import json
import os
import select
import shlex
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
HOLD_CLUSTER = """
import json, sys
from ray.cluster_utils import Cluster
dashboard_port, agent_port = int(sys.argv[1]), int(sys.argv[2])
try:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": True, "dashboard_host": "127.0.0.1",
        "dashboard_port": dashboard_port, "dashboard_agent_listen_port": agent_port})
except Exception as e:
    print("CLUSTER " + json.dumps({"error": repr(e)}), flush=True)
    sys.exit(0)
print("CLUSTER " + json.dumps({"dashboard": cluster.webui_url}), flush=True)
sys.stdin.read()  # hold the cluster until the test closes stdin
cluster.shutdown()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The JSON after the ``CLUSTER`` line ``proc`` prints, or "" if it ends first or prints nothing for
    ``timeout_s`` seconds."""
    while select.select([proc.stdout], [], [], timeout_s)[0]:
        line = proc.stdout.readline()
        if not line:  # the process exited
            return ""
        if line.startswith("CLUSTER "):
            return line[len("CLUSTER ") :]
    return ""


def _quiet_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1")
    return env


def _wait_for_job_api(url: str, timeout_s: float) -> None:
    from ray.job_submission import JobSubmissionClient

    def answers() -> bool:
        try:
            JobSubmissionClient(url).list_jobs()
        except Exception:
            return False
        return True

    wait_until(answers, f"the job API at {url}", limit_s=timeout_s, every_s=0.5)


def _missing_dashboard_packages() -> list[str]:
    """The packages of ``ray[default]`` the dashboard's job API needs that this environment lacks."""
    import importlib.util

    return [
        name
        for name in ("aiohttp", "aiohttp_cors", "opencensus", "prometheus_client")
        if importlib.util.find_spec(name) is None
    ]


def _submit(url: str, job_id: str, *entrypoint: str) -> subprocess.CompletedProcess[str]:
    """``ray job submit`` of ``entrypoint`` to the cluster at ``url``, with this repository as working dir."""
    command = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", url, "--submission-id", job_id]
    command += ["--working-dir", str(REPO), "--", *entrypoint]
    return subprocess.run(command, capture_output=True, text=True, env=_quiet_env(), timeout=180)


@pytest.mark.timeout(420)
def test_ray_job_submit_runs_the_example_on_the_cluster() -> None:
    # The one expected reason to skip: Ray without its dashboard (``ray`` instead of ``ray[default]``).
    missing = _missing_dashboard_packages()
    if missing:
        pytest.skip(f"ray[default] is not installed ({', '.join(missing)} missing): there is no job API to submit to")
    # Prepare: a private cluster with a dashboard, held by another process.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_CLUSTER, str(_free_port()), str(_free_port())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_quiet_env(),
        cwd="/",
    )
    try:
        line = _cluster_line(holder, timeout_s=60)
        started = json.loads(line or '{"error": "no cluster within 60 s, or its process exited"}')
        assert "error" not in started and started.get("dashboard"), f"no Ray dashboard for the job API: {started}"
        url = "http://" + started["dashboard"].removeprefix("http://")
        _wait_for_job_api(url, timeout_s=30)

        # Execute: submit the example as README.md does, with 2 rounds on small data.
        job_id = f"rayfed-test-{uuid.uuid4().hex[:8]}"
        entrypoint = " ".join(
            shlex.quote(a)
            for a in [
                sys.executable,
                "examples/cwfedavg_1000clients.py",
                "--rounds",
                "2",
                "--clients",
                "40",
                "--join-ratio",
                "0.5",
                "--workers",
                "2",
                'data.options={"num_samples": 2000}',
                "engine.progress=false",
            ]
        )
        submit = _submit(url, job_id, *shlex.split(entrypoint))
        output = submit.stdout + submit.stderr

        # Check: the job succeeded on that cluster, and wrote its run where it ran.
        from ray.job_submission import JobStatus, JobSubmissionClient

        client = JobSubmissionClient(url)
        assert submit.returncode == 0, output[-4000:]
        assert client.get_job_status(job_id) == JobStatus.SUCCEEDED, output[-4000:]
        logs = client.get_job_logs(job_id)
        assert "Ray: a private local Ray" not in logs, "the job started a Ray of its own instead of joining the cluster"
        summary = json.loads(next(line for line in logs.splitlines() if line.startswith("RESULT "))[7:])
        assert summary["rounds_run"] == 2 and 0.0 <= summary["final_accuracy"] <= 1.0
        run_dir = Path(summary["run_dir"])
        rounds = pq.read_table(run_dir / "rounds.parquet").to_pylist()
        assert [r["round"] for r in rounds] == [0, 1] and all(r["num_sampled"] == 20 for r in rounds)
        assert json.loads((run_dir / "config.json").read_text())["algorithm"]["name"] == "cwfedavg"
        # The uploaded working dir holds the code, not the venv, git history or earlier runs.
        job_dir = run_dir.parents[1]
        assert (job_dir / "rayfed" / "engine" / "simulation.py").is_file() and (job_dir / "examples").is_dir()
        assert not (job_dir / ".venv").exists() and not (job_dir / ".git").exists()
        assert [p.name for p in (job_dir / "runs").iterdir()] == [run_dir.name]

        # A method registered in the submitted script: the cluster's workers run it with the numbers of local.
        own_id = f"rayfed-test-{uuid.uuid4().hex[:8]}"
        own = _submit(url, own_id, sys.executable, "examples/own_method.py", "--rounds", "2", "--workers", "2")
        own_logs = client.get_job_logs(own_id)
        assert own.returncode == 0, (own.stdout + own.stderr)[-4000:]
        assert "same numbers on both backends: True" in own_logs, own_logs[-4000:]
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
