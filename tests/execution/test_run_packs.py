"""Which runs may share one stack, from their configs: runs that differ only in numbers pack, the others say why not."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rayfed import RunConfig
from rayfed.algorithms.registry import Capabilities
from rayfed.execution import run_packs
from rayfed.execution.run_packs import alone_reason, pack_key, pack_runs

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
