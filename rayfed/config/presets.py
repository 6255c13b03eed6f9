"""The papers' protocols as named presets: one word instead of a dozen config fields.

    rayfed run --preset cwfedavg-mnist data.root=~/data train.rounds=30
    rayfed run --preset cwfedavg-mnist algorithm.name=fedavg data.partition=pathological

A preset is plain data: dotted config paths and their values (the same paths as
``field.path=value`` overrides), applied to the defaults before the command line's own
overrides, so anything a preset sets can still be changed. Each one fixes what the
paper's code fixes: the data (dataset, clients, partition and its seed, the per-client
train/test split; every image dataset is normalised with mean = std = 0.5, as the
authors' code does), the model, the local optimiser, the rounds and the evaluation
(every round, the initial model as round 0, the train loss of the starting models; see
README.md, "Results"). The sources of every value are in docs/algorithms.md (cwFedAvg,
FedAWA and FedClassAvg sections, "Data and evaluation"). ``rayfed reproduce`` builds its
tables' columns on the same presets (:mod:`rayfed.reproduce`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rayfed.util.errors import ConfigError
from rayfed.util.registry import closest

__all__ = ["Preset", "PRESETS", "preset_overrides"]


@dataclass(frozen=True)
class Preset:
    """One paper's protocol: a one-line summary and the config values it sets (dotted paths)."""

    summary: str
    values: Mapping[str, Any] = field(default_factory=dict)


_EVAL = {
    "engine.join_ratio": 1.0,
    "engine.eval_every": 1,
    "engine.eval_clients": "all",
    "engine.eval_initial": True,
    "engine.eval_train_loss": True,
}
_PFLLIB_DATA = {  # PFLlib generators behind the cwFedAvg papers: 20 clients, seed 1, 75/25, Dir(0.1)
    "data.num_clients": 20,
    "data.seed": 1,
    "data.train_fraction": 0.75,
    "data.partition": "dirichlet",
    "data.alpha": 0.1,
    "data.min_samples": 1,
}
_CWFEDAVG = {
    **_PFLLIB_DATA,
    **_EVAL,
    "model.name": "cnn4",
    "train.rounds": 1000,
    "train.local_epochs": 1,
    "train.batch_size": 10,
    "train.lr": 0.005,
    "train.momentum": 0.0,
    "train.weight_decay": 0.0,
    "train.drop_last": True,
    "algorithm.name": "cwfedavg",
    "algorithm.params.fidelity": "code",
    "algorithm.params.variant": "wdr",
    "algorithm.params.classwise_blocks": 1,
}
_FEDAWA = {  # P-AWA App. A.5 and its code's defaults: 20 clients, Dir(0.1), 70/30, ResNet-20
    **_EVAL,
    "data.num_clients": 20,
    "data.seed": 10,
    "data.train_fraction": 0.7,
    "data.partition": "dirichlet",
    "data.alpha": 0.1,
    "data.min_samples": 0,
    "data.options": {"merge_splits": False},
    "engine.eval_initial": False,
    "model.name": "resnet20",
    "train.rounds": 300,
    "train.local_epochs": 1,
    "train.batch_size": 128,
    "train.lr": 0.08,
    "train.momentum": 0.9,
    "train.weight_decay": 5e-4,
    "train.lr_decay": 0.99,
    "algorithm.name": "fedawa",
}
_FCA_MODELS = ["fca_resnet18", "fca_shufflenet", "fca_googlenet", "fca_alexnet"]
_FEDCLASSAVG = {  # P-FCA Tab. 1 and §4.2: 20 heterogeneous clients (4 networks), Dir(0.5), Adam batch 64
    **_EVAL,
    "data.num_clients": 20,
    "data.seed": 2021,
    "data.train_fraction": 0.75,
    "data.partition": "dirichlet",
    "data.alpha": 0.5,
    "data.min_samples": 10,
    "data.options": {"merge_splits": False},
    "engine.eval_initial": False,
    "model.name": "fca_resnet18",
    "model.client_models": _FCA_MODELS,
    "train.rounds": 1000,  # the authors' code's max_rounds (P-FCA states none)
    "train.local_epochs": 1,
    "train.batch_size": 64,
    "algorithm.name": "fedclassavg",
}

PRESETS: dict[str, Preset] = {
    "cwfedavg-mnist": Preset(
        "cwFedAvg papers on MNIST: 20 clients, Dir(0.1) (data.partition=pathological for Path), cnn4, "
        "SGD lr 0.005 batch 10, lambda 10, 1000 rounds",
        {**_CWFEDAVG, "data.dataset": "mnist", "algorithm.params.wdr_lambda": 10.0},
    ),
    "cwfedavg-cifar10": Preset(
        "cwFedAvg papers on CIFAR-10 (as cwfedavg-mnist, lambda 10)",
        {**_CWFEDAVG, "data.dataset": "cifar10", "algorithm.params.wdr_lambda": 10.0},
    ),
    "cwfedavg-cifar100": Preset(
        "cwFedAvg papers on CIFAR-100 (as cwfedavg-mnist, lambda 1000; pathological: 10 classes per client)",
        {**_CWFEDAVG, "data.dataset": "cifar100", "data.classes_per_client": 10, "algorithm.params.wdr_lambda": 1000.0},
    ),
    "cwfedavg-tiny": Preset(
        "cwFedAvg papers on Tiny ImageNet (64x64, cnn4, lambda 2000; pathological: 20 classes per client)",
        {
            **_CWFEDAVG,
            "data.dataset": "tiny_imagenet",
            "data.classes_per_client": 20,
            "algorithm.params.wdr_lambda": 2000.0,
        },
    ),
    "fedawa-cifar10": Preset(
        "FedAWA paper on CIFAR-10: 20 clients, Dir(0.1) of the training set, 70/30, ResNet-20, SGD lr 0.08 "
        "momentum 0.9 wd 5e-4 decay 0.99, batch 128, 300 rounds",
        {**_FEDAWA, "data.dataset": "cifar10"},
    ),
    "fedawa-cifar100": Preset("FedAWA paper on CIFAR-100 (as fedawa-cifar10)", {**_FEDAWA, "data.dataset": "cifar100"}),
    "fedawa-tiny": Preset(
        "FedAWA paper on Tiny ImageNet (as fedawa-cifar10, ResNet-18)",
        {**_FEDAWA, "data.dataset": "tiny_imagenet", "data.options": {}, "model.name": "resnet18"},
    ),
    "fedawa-mnist": Preset(
        "FedAWA's clients on MNIST (this repository's MNIST stand-in: cnn4, lr 0.01, batch 50, merged splits)",
        {
            **_FEDAWA,
            "data.dataset": "mnist",
            "data.seed": 1,
            "data.options": {},
            "model.name": "cnn4",
            "train.lr": 0.01,
            "train.batch_size": 50,
            "train.lr_decay": 1.0,
        },
    ),
    "fedclassavg-cifar10": Preset(
        "FedClassAvg paper on CIFAR-10: 20 clients of 4 networks, Dir(0.5), Adam lr 1e-4 batch 64, rho 0.1",
        {**_FEDCLASSAVG, "data.dataset": "cifar10", "train.lr": 1e-4, "algorithm.params.rho": 0.1},
    ),
    "fedclassavg-fmnist": Preset(
        "FedClassAvg paper on Fashion-MNIST: as fedclassavg-cifar10 with lr 6e-4, rho 0.4662",
        {**_FEDCLASSAVG, "data.dataset": "fashion_mnist", "train.lr": 6e-4, "algorithm.params.rho": 0.4662},
    ),
    "fedclassavg-emnist": Preset(
        "FedClassAvg paper on EMNIST-Letters: as fedclassavg-cifar10 with lr 5e-4, rho 0.1",
        {
            **_FEDCLASSAVG,
            "data.dataset": "emnist_letters",
            "train.lr": 5e-4,
            "algorithm.params.rho": 0.1,
            "data.options": {"merge_splits": False, "na_class": True},
        },
    ),
}


def preset_overrides(name: str) -> dict[str, Any]:
    """The dotted config values of preset ``name``; an unknown name raises ConfigError listing the presets.

    >>> preset_overrides("cwfedavg-mnist")["train.batch_size"]
    10
    """
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}{closest(name, list(PRESETS))}; presets: {', '.join(PRESETS)}")
    return dict(PRESETS[name].values)
