"""Resources that fit and sizes before start: a run that cannot fit is refused in seconds, before any file.
"In seconds" is told by what was not done before the refusal (no dataset loaded, no Ray started), not by a
clock."""

from __future__ import annotations

import logging
import tracemalloc

import pytest
import torch

from rayfed import ResourceError, RunConfig, Simulation, run
from rayfed.actors.cluster import check_fit, local_node, workers_on
from rayfed.config import EngineConfig
from rayfed.engine.sizing import check_memory, estimate_memory
from tests.conftest import tiny_overrides


def _config(tmp_path, **overrides: object) -> RunConfig:
    return RunConfig().override(tiny_overrides(tmp_path / "run", **overrides))


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    """The datasets the engine loads (or generates) during the test, by name."""
    import rayfed.engine.inputs

    names: list[str] = []
    load = rayfed.engine.inputs.load_dataset
    monkeypatch.setattr(
        rayfed.engine.inputs, "load_dataset", lambda name, *a, **k: names.append(name) or load(name, *a, **k)
    )
    return names


@pytest.mark.timeout(30)
def test_more_workers_than_this_machine_has_cpus_are_refused_before_ray_starts(tmp_path, loads) -> None:
    import ray

    if ray.is_initialized():
        pytest.skip("Ray already runs in this process; the cluster case is tested below")
    cpus = local_node()[0]["CPU"]
    asked = int(cpus) + 4  # engine.num_workers=6 on a 2-CPU machine
    with pytest.raises(ResourceError) as raised:
        run(_config(tmp_path, **{"engine.backend": "ray", "engine.num_workers": asked}))
    assert loads == []  # refused before the dataset is made
    message = str(raised.value)
    for fragment in (
        f"engine.num_workers={asked}",
        f"need {asked:g} CPUs",
        f"this machine has {cpus:g} CPUs",
        f"room for {int(cpus)} workers",
    ):
        assert fragment in message
    assert not (tmp_path / "run").exists()
    assert not ray.is_initialized()  # refused without starting Ray


@pytest.mark.timeout(60)
def test_more_workers_than_the_ray_cluster_holds_are_refused_before_anything_is_written(tmp_path, ray_cluster) -> None:
    cpus = ray_cluster.cluster_resources()["CPU"]
    asked = int(cpus) + 4
    with pytest.raises(
        ResourceError,
        match=rf"engine.num_workers={asked} asks for {asked} workers, which need "
        rf"{asked} CPUs .*the Ray cluster has {cpus:g} CPUs",
    ):
        run(_config(tmp_path, **{"engine.backend": "ray", "engine.num_workers": asked}))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("engine", "nodes", "fragments"),
    [
        (
            {"num_gpus_per_worker": 2},
            [{"CPU": 8, "GPU": 1}],
            ["engine.num_gpus_per_worker=2 exceeds the 1 GPUs of the largest node of the cluster", "at most 1"],
        ),
        (
            {"num_gpus_per_worker": 0.5, "num_workers": 5},
            [{"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1}],
            ["engine.num_workers=5", "5 CPUs", "2.5 GPUs (engine.num_gpus_per_worker=0.5 each)", "room for 4 workers"],
        ),
        (
            {"num_cpus_per_worker": 4},
            [{"CPU": 2}, {"CPU": 2}],
            ["engine.num_cpus_per_worker=4 exceeds the 2 CPUs of the largest node", "one worker runs on one node"],
        ),
        ({"num_gpus_per_worker": 1}, [{"CPU": 2}], ["engine.num_gpus_per_worker=1 but the cluster has no GPUs"]),
    ],
)
def test_workers_that_no_node_can_place_are_refused_with_the_numbers(engine, nodes, fragments) -> None:
    with pytest.raises(ResourceError) as raised:
        check_fit(EngineConfig(**engine), nodes, "the cluster")
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_a_worker_is_placed_on_one_node() -> None:
    # Per node: min(CPUs / 1, GPUs / 0.5); the CPU-only node holds no GPU worker.
    nodes = [{"CPU": 2, "GPU": 4}, {"CPU": 3, "GPU": 1}, {"CPU": 16}]
    assert workers_on(nodes, EngineConfig(num_gpus_per_worker=0.5)) == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpus_in_process_without_cuda_are_refused_before_anything_is_written(tmp_path) -> None:
    with pytest.raises(ResourceError, match=r"engine.num_gpus_per_worker=0.5 but this machine has no CUDA GPU"):
        run(_config(tmp_path, **{"engine.num_gpus_per_worker": 0.5}))
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(30)
def test_a_dataset_larger_than_memory_is_refused_in_seconds_with_the_estimate(tmp_path, loads) -> None:
    with pytest.raises(ResourceError) as raised:
        run(_config(tmp_path, **{"data.options": {"num_samples": 10**9}}))
    assert loads == []  # refused from the estimate, before a sample of the 10^9 is drawn
    message = str(raised.value)
    for fragment in ("this run needs about", "GiB of memory (dataset 7", "available of", "data.options.num_samples"):
        assert fragment in message
    assert not (tmp_path / "run").exists()


def test_ten_million_clients_are_refused_or_warned_about_naming_the_clients(tmp_path, monkeypatch, caplog) -> None:
    # A config far beyond any machine: 10,000,000 clients over 10,000,000 synthetic samples.
    config = _config(tmp_path, **{"data.num_clients": 10**7, "data.options": {"num_samples": 10**7}})
    estimate = estimate_memory(config)
    assert {p.name: p.field for p in estimate.parts}["round records"] == "data.num_clients"
    monkeypatch.setattr("rayfed.engine.sizing.available_memory", lambda: (estimate.total // 2, 2 * estimate.total))
    with pytest.raises(ResourceError, match=r"data.num_clients.*partition .*\(data.num_clients\)"):
        check_memory(config)


def test_a_run_using_more_than_half_the_memory_warns_with_the_estimate(tmp_path, monkeypatch, caplog) -> None:
    config = _config(tmp_path)
    total = estimate_memory(config).total
    monkeypatch.setattr("rayfed.engine.sizing.available_memory", lambda: (int(total / 0.6), 2 * total))
    with caplog.at_level(logging.WARNING, logger="rayfed.engine.sizing"):
        check_memory(config)
    assert "this run needs about" in caplog.text and "the largest part is the dataset" in caplog.text


@pytest.mark.timeout(120)
def test_the_estimate_is_within_a_factor_two_of_the_measured_peak(tmp_path) -> None:
    # numpy's allocations (dataset, generator, partition) are traced; the model and torch are small here.
    config = _config(
        tmp_path, **{"data.options": {"num_samples": 40_000}, "data.num_clients": 2_000, "data.partition": "iid"}
    )
    estimate = estimate_memory(config).total
    tracemalloc.start()
    try:
        Simulation(config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"estimate {estimate / 2**20:.1f} MiB, traced peak {peak / 2**20:.1f} MiB")
    assert peak / 2 <= estimate <= 2 * peak, (estimate, peak)


@pytest.mark.parametrize("shown", [True, False])
def test_long_rounds_show_a_bar_over_their_client_batches(tmp_path, monkeypatch, capsys, shown) -> None:
    """Inside a round, on a terminal, a bar counts the finished client batches of training and of evaluation (here
    with no delay, so even a short round shows it); engine.progress=false shows none."""
    import rayfed.util.progress

    monkeypatch.setattr(rayfed.util.progress, "DELAY_S", 0.0)
    monkeypatch.setattr(rayfed.util.progress, "on_terminal", lambda: True)
    run(RunConfig().override(tiny_overrides(tmp_path / "run", **{"train.rounds": 1, "engine.progress": shown})))
    err = capsys.readouterr().err
    assert ("round 0 training" in err and "round 0 evaluation" in err and "batch" in err) == shown
