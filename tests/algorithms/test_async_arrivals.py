"""FedBuff's server fed by the asynchronous schedule: every launched update applied once, in the step it arrives
at, with its own staleness, however often one client is launched from one version (a fast client that reports is
often drawn again at once), so that every step applies K updates."""

from __future__ import annotations

import numpy as np

from rayfed.algorithms import ClientVectors, RoundContext, sum_contributions
from rayfed.algorithms.common.asynchronous import staleness_weight
from rayfed.algorithms.fedbuff import FedBuffParams, FedBuffServer
from rayfed.system import AsyncSchedule, Availability, DeviceProfiles, SystemConfig, Workload, load_profiles
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec


def _server(num_clients: int, concurrency: int, buffer_size: int) -> FedBuffServer:
    layout = ParamLayout(("w",), ((num_clients,),), (0, num_clients))
    spec = ProblemSpec(4, 2, (1, 2, 2), {"m": layout}, {"m": ("w",)}, {"m": "w"}, default_architecture="m")
    params = FedBuffParams(concurrency=concurrency, buffer_size=buffer_size, server_lr=1.0)
    return FedBuffServer(params, spec, {"m": np.zeros(num_clients, np.float32)})


def _walk(schedule: AsyncSchedule, server: FedBuffServer, steps: int) -> tuple[list[float], int]:
    """Train ``steps`` versions as the round loop does, each launch moving θ by its client's unit vector times
    (its version + 1); check θ after each step against the updates the schedule says arrive in it, each weighted by
    its own staleness. The aggregated counts, and how many versions launched a client twice."""
    num_clients = len(server.global_vector)
    models: dict[int, np.ndarray] = {}  # version -> θ
    launched_from: dict[int, tuple[int, int]] = {}  # launch index -> (client, version)
    counts, repeats = [], 0
    for version in range(steps):
        models[version] = server.global_vector.copy()
        plan = schedule.plan(version)
        launched_from.update(
            {int(i): (int(c), version) for i, c in zip(plan.step.launched_index, plan.launched, strict=True)}
        )
        repeats += len(plan.to_train) != len(set(plan.to_train.tolist()))
        order = np.argsort(plan.to_train, kind="stable")
        sampled, arrives = plan.to_train[order], plan.arrives_at[plan.arrives_at >= 0][order]
        uploads = [
            ClientVectors.of(models[version] - np.eye(num_clients, dtype=np.float32)[c] * (version + 1), int(c), 1.0)
            for c in sampled
        ]
        ctx = RoundContext(round=version, seed=0, lr=0.1, sampled=sampled)
        total = sum_contributions(uploads) if uploads else None
        metrics = (
            server.aggregate_arriving(ctx, total, arrives) if total is not None else server.step_without_uploads(ctx)
        )
        counts.append(metrics["clients_aggregated"])
        expected = models[version].astype(np.float64)
        weights = staleness_weight(plan.step.staleness, "polynomial", 0.5, 0)
        for index, weight in zip(plan.step.arrived_launch.tolist(), weights, strict=True):
            client, start = launched_from[index]
            expected[client] -= weight * (start + 1) / len(weights)  # θ − Σ s Δ / K, Δ = θ_τ − x
        np.testing.assert_allclose(server.global_vector, expected, rtol=1e-5, atol=1e-5)
    return counts, repeats


def test_a_client_launched_twice_from_one_version_has_each_update_applied_at_its_own_arrival() -> None:
    # Prepare: 3 clients whose rounds take 1.82, 2.63 and 4.56 s, C = 3, K = 2: client 0 reports at 1.82 s and is
    # drawn again from version 0, so version 0 launches it twice, its updates arriving at versions 1 and 2
    devices = DeviceProfiles(np.array([1.82, 2.63, 4.56]), np.full(3, 1e30), np.full(3, 1e30), Availability.everyone(3))
    work = Workload(np.ones(3, dtype=np.int64), bytes_down=0.0, bytes_up=0.0)
    config = SystemConfig(devices="equal", step_s=1.0)
    schedule = AsyncSchedule(config, devices, work, 0, concurrency=3, buffer_size=2, last_version=12)
    first = schedule.plan(0)
    assert first.launched.tolist() == [2, 0, 1, 0] and first.arrives_at.tolist() == [2, 1, 1, 2]
    # Execute
    counts, repeats = _walk(
        AsyncSchedule(config, devices, work, 0, concurrency=3, buffer_size=2, last_version=12), _server(3, 3, 2), 8
    )
    # Assert: θ checked step by step in _walk; every step applies K = 2 updates
    assert counts == [2.0] * 8 and repeats >= 3


def test_a_300_step_walk_of_heterogeneous_devices_applies_k_updates_at_every_step() -> None:
    config = SystemConfig(devices="lognormal", compute_spread=1.0)
    devices = load_profiles(config, 20)
    assert devices is not None
    work = Workload(np.full(20, 20, dtype=np.int64), bytes_down=4e5, bytes_up=4e5)
    schedule = AsyncSchedule(config, devices, work, 0, concurrency=10, buffer_size=5, last_version=310)
    counts, repeats = _walk(schedule, _server(20, 10, 5), 300)
    assert counts == [5.0] * 300 and repeats > 0
