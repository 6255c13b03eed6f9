"""The ``data`` section of a run's config: which dataset, how it is split over clients, how each client splits
its share.

It sits below the data modules that read it; the names it refers to (``data.dataset``, ``data.partition``) are
checked against their registries by :class:`~rayfed.config.RunConfig`, which sits above them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rayfed.util.documented import documented, section
from rayfed.util.errors import ConfigError
from rayfed.util.validation import check, check_int, check_real, is_int

__all__ = ["DataConfig", "PFLLIB"]

PFLLIB = "pfllib"
"""The name of both the dataset and the partition of a folder a PFLlib generator wrote."""


@section("data")
@dataclass(frozen=True)
class DataConfig:
    """Which dataset, how it is split over clients, and how each client splits its share.

    Defaults follow the PFLlib generators behind the cwFedAvg papers: 20 clients,
    Dirichlet(0.1), 75/25 train/test per client, partition seed 1.
    """

    dataset: str = documented("synthetic", "A registered dataset (rayfed list): synthetic (offline), mnist, ...")
    root: str | None = documented(
        None,
        "Folder holding the dataset files (torchvision layout; for pfllib the "
        "folder a PFLlib generator wrote); unused by synthetic.",
    )
    download: bool = documented(False, "Let torchvision download missing files (needs network).")
    options: Mapping[str, Any] = documented({}, 'Dataset-specific options, e.g. {"num_samples": 20000} for synthetic.')
    num_clients: int = documented(20, "M, the number of clients (at most the number of samples, except with slices).")
    partition: str = documented(
        "dirichlet",
        "How samples are split over clients: dirichlet, pathological, iid, slices (of a shared pool), or pfllib "
        "(each client's own files of a PFLlib folder; with data.dataset=pfllib).",
    )
    alpha: float = documented(0.1, "Dirichlet concentration (partition=dirichlet), > 0; smaller is more skewed.")
    classes_per_client: int = documented(
        2, "Classes per client (partition=pathological), at most the dataset's classes."
    )
    min_samples: int = documented(
        1,
        "PFLlib's least_samples: Dirichlet redraws until every client holds at least this many samples; the "
        "pathological partitioner uses it in its lower block-size bound. 0 allows empty clients.",
    )
    balance: bool = documented(
        False, "Pathological partition: equal block sizes per client instead of PFLlib's random sizes."
    )
    samples_per_client: int = documented(
        0, "Slices partition: each client's slice of the shuffled pool; 0 = samples // num_clients."
    )
    train_fraction: float = documented(
        0.75,
        "f in (0, 1): each client trains on floor(f * n_i) of its samples and tests on the rest "
        "(1 is not allowed: every client is evaluated on its own test split).",
    )
    seed: int = documented(1, "Partition seed in [0, 2**32 - 1]; fixed across training seeds, as in the papers.")

    def __post_init__(self) -> None:
        check(isinstance(self.dataset, str) and bool(self.dataset), "data.dataset", self.dataset, "a dataset name")
        check_int("data.num_clients", self.num_clients, low=1)
        if (self.dataset == PFLLIB) != (self.partition == PFLLIB):
            raise ConfigError(
                f"data.dataset={self.dataset!r} with data.partition={self.partition!r}: a PFLlib folder's clients "
                f"train and test on their own files, so data.dataset='{PFLLIB}' and data.partition='{PFLLIB}' "
                "go together; set both or neither"
            )
        check_real("data.alpha", self.alpha, low=0, low_open=True)
        check_int("data.classes_per_client", self.classes_per_client, low=1)
        check_int("data.min_samples", self.min_samples, low=0)
        check(isinstance(self.balance, bool), "data.balance", self.balance, "true or false")
        check_int("data.samples_per_client", self.samples_per_client, low=0)
        check_real("data.train_fraction", self.train_fraction, low=0, high=1, low_open=True, high_open=True)
        check(is_int(self.seed) and 0 <= self.seed < 2**32, "data.seed", self.seed, "an integer in [0, 2**32 - 1]")
        object.__setattr__(self, "options", dict(self.options))
