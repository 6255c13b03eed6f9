"""A Ray cluster to join that does not answer is refused in seconds, before anything is written
(``rayfed.actors.address``): one line naming the setting, its value and the fix, and Ctrl-C or SIGTERM end
the wait at once. "At once" is told by what was tried (one connection, at most one request to the head, never
``ray.init``) and by what ended a wait, never by a clock: the shared box's load would make one fail."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rayfed.actors import address
from rayfed.actors.address import check_reachable
from rayfed.actors.cluster import ray_started
from rayfed.engine.interrupts import Terminated, terminate_as_interrupt
from rayfed.util.errors import ResourceError
from tests.conftest import tiny_overrides


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts no connection and refuses none: a listener whose queue is full, so a new
    connection waits unanswered, as one to a host that drops packets does."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    queued = []
    for _ in range(4):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.1", port))
        queued.append(client)
    time.sleep(0.1)
    yield port
    for client in queued:
        client.close()
    server.close()


@dataclass
class Knocks:
    """What :func:`check_reachable` tried: its TCP connections (address, timeout) and its requests to a head."""

    connections: list[tuple[tuple[str, int], float | None]] = field(default_factory=list)
    requests: list[tuple[str, int]] = field(default_factory=list)


@pytest.fixture
def knocks(monkeypatch: pytest.MonkeyPatch) -> Knocks:
    """Every connection and cluster-id request of the test's knocks, each still made."""
    seen = Knocks()
    connect, ask = socket.create_connection, address._not_a_head

    def counted_connect(where: tuple[str, int], timeout: float | None = None, *args: object) -> socket.socket:
        seen.connections.append((where, timeout))
        return connect(where, timeout, *args)

    def counted_ask(host: str, port: int) -> str | None:
        seen.requests.append((host, port))
        return ask(host, port)

    monkeypatch.setattr(socket, "create_connection", counted_connect)
    monkeypatch.setattr(address, "_not_a_head", counted_ask)
    return seen


def test_a_closed_port_is_refused_at_once_naming_the_setting_and_the_fix(knocks: Knocks) -> None:
    port = _closed_port()
    with pytest.raises(ResourceError) as raised:
        check_reachable(f"127.0.0.1:{port}", "engine.ray_address")
    assert knocks.connections == [(("127.0.0.1", port), address.CONNECT_S)] and knocks.requests == []  # no retry
    message = str(raised.value)
    assert message.startswith(f"engine.ray_address='127.0.0.1:{port}': no Ray cluster answers at 127.0.0.1:{port}")
    assert "connection refused" in message and "set engine.ray_address= (empty)" in message


def test_an_address_from_the_environment_is_named_as_such() -> None:
    with pytest.raises(ResourceError, match=r"^RAY_ADDRESS='ray://127.0.0.1:\d+' \(from the environment\).*unset RAY"):
        check_reachable(f"ray://127.0.0.1:{_closed_port()}", "RAY_ADDRESS")


@pytest.mark.parametrize("value", ["head-node", "127.0.0.1:99999", "127.0.0.1:port", ":6379"])
def test_a_value_that_is_no_address_says_what_an_address_is(value: str) -> None:
    with pytest.raises(ResourceError, match=rf"^engine.ray_address='{value}' is not a cluster's address: .*HOST:PORT"):
        check_reachable(value)


def test_an_unknown_host_is_named() -> None:
    with pytest.raises(ResourceError, match=r"no Ray cluster answers at no-such-host.invalid:6379 \(unknown host\)"):
        check_reachable("no-such-host.invalid:6379")


def test_a_host_that_never_answers_is_refused_after_the_connect_timeout(
    silent_port: int, monkeypatch: pytest.MonkeyPatch, knocks: Knocks
) -> None:
    monkeypatch.setattr(address, "CONNECT_S", 0.5)
    with pytest.raises(ResourceError, match=r"\(no answer in 0.5 s\)"):
        check_reachable(f"127.0.0.1:{silent_port}")
    assert knocks.connections == [(("127.0.0.1", silent_port), 0.5)] and knocks.requests == []


def test_sigterm_ends_the_wait_for_an_address_at_once(silent_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(address, "CONNECT_S", 60.0)  # the wait the signal must end
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    with pytest.raises(Terminated) as raised, terminate_as_interrupt():
        timer.start()
        check_reachable(f"127.0.0.1:{silent_port}")
    timer.join()
    # Raised inside the connection's wait, not after it ran out (a handler deferred to the end of a blocking
    # call would raise from check_reachable's own code, after CONNECT_S).
    assert "create_connection" in [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]


def test_ray_is_not_initialised_for_an_address_that_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    monkeypatch.setattr("ray.is_initialized", lambda: False)
    monkeypatch.setattr("ray.init", lambda **kwargs: calls.append(kwargs))
    with (
        pytest.raises(ResourceError, match="^engine.ray_address="),
        ray_started(f"127.0.0.1:{_closed_port()}", source="engine.ray_address"),
    ):
        pass
    assert calls == []


def _rayfed(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [sys.executable, "-m", "rayfed", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_command_line_refuses_a_gone_cluster_in_one_line_and_a_resume_writes_nothing(tmp_path: Path) -> None:
    """``rayfed run engine.ray_address=HOST:PORT`` with nothing there, and the resume of a run whose cluster is
    gone: exit 2 in seconds, one line, no traceback, and the run directory as it was."""
    port = _closed_port()
    run_dir = tmp_path / "run"
    tiny = {**tiny_overrides(run_dir), "data.options.num_samples": 3000}
    overrides = ["run", *(f"{key}={value}" for key, value in tiny.items() if key != "data.options")]
    fresh = _rayfed(*overrides, "engine.backend=ray", f"engine.ray_address=127.0.0.1:{port}", cwd=tmp_path)
    # One line and nothing else: ray.init, which retries such an address for minutes, warns as it retries.
    assert fresh.returncode == 2 and "Traceback" not in fresh.stderr and not run_dir.exists()
    assert fresh.stderr.strip().splitlines() == [
        f"rayfed: error: engine.ray_address='127.0.0.1:{port}': no Ray cluster answers at 127.0.0.1:{port} "
        "(connection refused); start that cluster, give the address of a running one, or set engine.ray_address= "
        "(empty) to run on a private local Ray"
    ]

    assert _rayfed(*overrides, "--quiet", cwd=tmp_path).returncode == 0
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    resumed = _rayfed(
        "run", "--resume", str(run_dir), "engine.backend=ray", f"engine.ray_address=127.0.0.1:{port}", cwd=tmp_path
    )
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr
    assert f"engine.ray_address='127.0.0.1:{port}': no Ray cluster answers" in resumed.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_study_on_a_gone_cluster_is_refused_before_its_storage_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rayfed.cli import main

    monkeypatch.setattr("ray.is_initialized", lambda: False)  # as in a fresh `rayfed tune`
    space = tmp_path / "space.yaml"
    space.write_text("train.lr: {type: float, low: 0.001, high: 0.1, log: true}\n")
    port = _closed_port()

    code = main(["tune", str(space), f"engine.ray_address=127.0.0.1:{port}", "--study-dir", str(tmp_path / "study")])

    assert code == 2 and f"engine.ray_address='127.0.0.1:{port}': no Ray cluster answers" in capsys.readouterr().err
    assert not (tmp_path / "study").exists()


@pytest.fixture
def web_server() -> Iterator[int]:
    """A port where a server answers, but in HTTP/1 (as the dashboard's 8265 or any web server does)."""
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_port_that_answers_but_not_as_a_ray_head_is_refused_at_once(web_server: int, knocks: Knocks) -> None:
    # The reason is the server's answer (HTTP/1, where gRPC wants HTTP/2), not the request's deadline, which
    # would read "no answer to a Ray request in 5 s"; ray.init would wait on such a port without end.
    with pytest.raises(ResourceError, match=r"127.0.0.1:\d+ answers, but not as a Ray cluster's head \(.*HTTP/2"):
        check_reachable(f"127.0.0.1:{web_server}")
    assert len(knocks.connections) == 1 and knocks.requests == [("127.0.0.1", web_server)]


def test_a_port_that_accepts_but_never_speaks_is_refused_after_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch, knocks: Knocks
) -> None:
    monkeypatch.setattr(address, "CONNECT_S", 0.5)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)  # the kernel accepts; nothing is ever sent back
        with pytest.raises(ResourceError, match=r"answers, but not as a Ray cluster's head \(no answer .* in 0.5 s\)"):
            check_reachable(f"127.0.0.1:{server.getsockname()[1]}")
    assert len(knocks.connections) == 1 and len(knocks.requests) == 1  # one request, bounded by CONNECT_S


def test_a_running_clusters_head_is_let_through() -> None:
    import ray

    with ray_started(None):
        gcs = ray.get_runtime_context().gcs_address
        check_reachable(gcs)  # it answers the cluster-id request as a head does
        check_reachable(gcs, "RAY_ADDRESS")


JOIN_AUTO = """
import logging
from rayfed.actors.cluster import ray_started
logging.basicConfig(level=logging.WARNING, format="%(message)s")
logging.getLogger("rayfed").setLevel(logging.INFO)
with ray_started("auto", source="RAY_ADDRESS"):
    import ray
    print("JOINED", ray.get_runtime_context().gcs_address, flush=True)
"""


@pytest.fixture
def ray_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where Ray records the cluster ``ray start`` started last, in a temp folder of the test's own
    (``RAY_TMPDIR``), so that the machine's record is neither read nor touched; it holds no record yet."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    return tmp_path / "ray" / "ray_current_cluster"


def test_auto_without_a_cluster_started_by_ray_start_is_refused_though_another_ray_runs(
    ray_cluster, ray_record: Path
) -> None:
    # Another Ray runs on this machine (the session's private one), which Ray's own "auto" would join.
    assert ray_cluster.is_initialized() and not ray_record.exists()

    with pytest.raises(ResourceError) as refused:
        check_reachable("auto", "RAY_ADDRESS")

    assert str(refused.value) == (
        "RAY_ADDRESS='auto' (from the environment) means the cluster `ray start` started last on this machine, but "
        f"none is recorded ({ray_record} does not exist); other Ray instances here, such as another user's private "
        "one, are never joined. Start one with `ray start --head`, give a cluster's HOST:PORT, or unset RAY_ADDRESS "
        "to run on a private local Ray"
    )


def test_auto_joins_the_recorded_cluster_and_names_its_address_nodes_and_cpus(ray_cluster, ray_record: Path) -> None:
    gcs = ray_cluster.get_runtime_context().gcs_address
    ray_record.write_text(gcs)  # as `ray start --head` records its cluster
    assert check_reachable("auto") == gcs

    env = {**os.environ, "RAY_ADDRESS": "auto"}  # RAY_TMPDIR: the test's record
    joined = subprocess.run(
        [sys.executable, "-c", JOIN_AUTO], env=env, capture_output=True, text=True, timeout=120, cwd=Path.cwd()
    )

    assert joined.returncode == 0, joined.stderr[-2000:]
    assert f"JOINED {gcs}" in joined.stdout.splitlines()
    cpus = ray_cluster.cluster_resources()["CPU"]
    assert f"joined the Ray cluster at {gcs} (RAY_ADDRESS='auto'): 1 node, {cpus:g} CPUs, 0 GPUs" in joined.stderr


def test_a_stale_record_is_named_with_the_address_it_holds(ray_record: Path) -> None:
    port = _closed_port()
    ray_record.write_text(f"127.0.0.1:{port}")  # a cluster that ended without `ray stop`
    with pytest.raises(ResourceError) as refused:
        check_reachable("auto")
    assert str(refused.value).startswith(
        f"engine.ray_address='auto' (the cluster `ray start` started last, at 127.0.0.1:{port}): no Ray cluster "
        f"answers at 127.0.0.1:{port} (connection refused)"
    )
