"""Which runs may share one stack, from their configs: runs that differ only in numbers pack, the others say why not."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rayfed import RunConfig
from rayfed.algorithms import RoundContext
from rayfed.algorithms.registry import Capabilities
from rayfed.execution import run_packs
from rayfed.execution.devices import check_local_gpu, pick_device, stacks_on
from rayfed.execution.round_facts import RoundFacts
from rayfed.execution.run_packs import alone_reason, pack_key, pack_runs
from rayfed.util.errors import ResourceError
from tests.conftest import runner_and_server

STACKED = {"engine.backend": "local", "engine.vectorize": "on", "algorithm.name": "cwfedavg"}


def config(**overrides: object) -> RunConfig:
    return RunConfig().override({**STACKED, **overrides})


def test_seeds_learning_rates_lambdas_and_partitions_pack_together() -> None:
    configs = [
        config(seed=0),
        config(seed=1, **{"train.lr": 0.05, "train.rounds": 7}),
        config(**{"algorithm.params.wdr_lambda": 500.0, "data.partition": "dirichlet", "data.alpha": 0.5}),
        config(**{"data.num_clients": 50, "data.seed": 3, "engine.progress": False}),
    ]
    packs = pack_runs(configs)
    assert packs.packs == ((0, 1, 2, 3),) and packs.alone == {}
    assert pack_key(configs[0]) == pack_key(configs[3])


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"model.name": "resnet20"}, "model.name"),
        ({"train.batch_size": 20}, "train.batch_size"),
        ({"train.local_epochs": 2}, "train.local_epochs"),
        ({"train.momentum": 0.9}, "train.momentum"),
        ({"data.dataset": "mnist"}, "data.dataset"),
        ({"data.options": {"num_samples": 3000}}, "data.options"),
        ({"algorithm.params.classwise_blocks": 2}, "algorithm.params"),  # an integer: the method's structure
        ({"algorithm.name": "fedavg", "algorithm.params": {}}, "algorithm.name"),
    ],
)
def test_a_run_of_another_structure_trains_alone_naming_the_first_difference(overrides, field) -> None:
    packs = pack_runs([config(seed=0), config(seed=1), config(**overrides)])
    assert packs.packs == ((0, 1),)
    assert list(packs.alone) == [2] and packs.alone[2].startswith(f"its {field}="), packs.alone[2]
    assert packs.alone[2].endswith("as in the largest pack")


def test_runs_that_do_not_stack_here_train_alone_whatever_the_others() -> None:
    cpu = config(**{"engine.vectorize": "auto"})  # the default: auto, no GPU share
    off = config(**{"engine.vectorize": "off"})
    gpu = config(**{"engine.vectorize": "auto", "engine.num_gpus_per_worker": 0.5})
    on_ray = RunConfig().override({"algorithm.name": "cwfedavg", "engine.vectorize": "on"})
    assert alone_reason(on_ray) == ""  # a pack of Ray runs is one Ray task (rayfed.actors.pack_host)
    assert "on the CPU, where stacking does not pay" in alone_reason(cpu)
    assert alone_reason(off) == "engine.vectorize='off' trains its clients one at a time"
    assert alone_reason(gpu) == ""
    packs = pack_runs([cpu, cpu, off, gpu, gpu, on_ray, on_ray.override({"seed": 1})])
    assert packs.packs == ((3, 4), (5, 6)) and sorted(packs.alone) == [0, 1, 2]  # the backends apart


@pytest.mark.parametrize("cuda", [False, True])
def test_the_config_and_the_worker_decide_alike_whether_a_run_stacks(monkeypatch, cuda: bool) -> None:
    """``alone_reason`` decides from the config before anything runs, the worker from the device it picked; both ask
    ``devices.stacks_on``. A local run that asks for a GPU share where there is no CUDA trains nowhere: it is refused
    before anything runs, so wherever a local run trains, its device is the one its config names."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", torch.backends.cudnn.allow_tf32)  # pick_device sets both
    monkeypatch.setattr(torch.backends.cuda, "matmul", SimpleNamespace(allow_tf32=False))
    for vectorize in ("on", "off", "auto"):
        for gpus in (0.0, 0.5):
            run = config(**{"engine.vectorize": vectorize, "engine.num_gpus_per_worker": gpus})
            if gpus and not cuda:
                with pytest.raises(ResourceError, match="engine.num_gpus_per_worker=0.5"):
                    check_local_gpu(run.engine)
                continue
            check_local_gpu(run.engine)
            assert (alone_reason(run) == "") == stacks_on(vectorize, pick_device(gpus).type), (vectorize, gpus)


@pytest.mark.parametrize("vectorize", ["on", "off", "auto"])
def test_a_worker_stacks_exactly_where_the_config_says_the_run_may_pack(tmp_path, vectorize: str) -> None:
    overrides = {"data.dataset": "synthetic", "data.options": {"num_samples": 120}, "data.num_clients": 4}
    run = config(**overrides, **{"engine.vectorize": vectorize, "model.name": "cnn4", "run_dir": str(tmp_path)})
    runner, _ = runner_and_server(run, tmp_path)
    ctx = RoundFacts.of(RoundContext(round=0, seed=0, lr=0.01, sampled=np.arange(4)))
    ids = [0, 1, 2, 3]
    jobs = [runner.job(cid, ctx, None, train=data) for cid, data in zip(ids, runner.train_samples(ids))]
    stacked = any(len(group) > 1 for group in runner._stacks(jobs))
    assert stacked == (alone_reason(run) == ""), vectorize
    assert stacked == (vectorize == "on")  # the CPU: auto trains one client at a time


def test_a_method_that_declares_it_cannot_stack_trains_alone(monkeypatch) -> None:
    limited = Capabilities(stacks=False, reason="its loss reads a value back to the host")
    monkeypatch.setattr(run_packs, "resolve", lambda algorithm: SimpleNamespace(capabilities=limited))
    assert alone_reason(config()) == "algorithm 'cwfedavg' does not stack: its loss reads a value back to the host"
    assert pack_runs([config(), config(seed=1)]).packs == ()


def test_the_log_line_names_each_pack_and_each_run_alone_with_why() -> None:
    packs = pack_runs([config(), config(**{"train.batch_size": 20}), config(seed=2), config(seed=3)])
    line = packs.line(["a", "b", "c", "d"])
    assert line == "packed a + c + d; b alone (its train.batch_size=20, not 10 as in the largest pack)"
    lone = pack_runs([config()])
    assert lone.line(["a"]) == "a alone (no other run shares its model, data shapes, steps and method)"
    assert pack_runs([]).line([]) == "no runs"
