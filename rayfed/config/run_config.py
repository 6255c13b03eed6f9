"""One typed, validated configuration object per run.

``RunConfig`` is a tree of frozen dataclasses. Every field is checked when the object
is built, and a bad value raises :class:`~rayfed.util.errors.ConfigError` naming the field
(as a dotted path such as ``train.lr``), the value received and what is allowed. The
same object runs from Python (:func:`rayfed.run`), from the command line
(``rayfed run config.toml train.lr=0.01``) and inside an Optuna trial, which
overrides fields by the same dotted paths. Each field's meaning is declared with it
(:mod:`rayfed.util.documented`): ``help(TrainConfig)`` and ``rayfed run --help`` list them.

>>> cfg = RunConfig().override({"train.lr": 0.01, "data.num_clients": 10})
>>> cfg.train.lr, cfg.data.num_clients
(0.01, 10)
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayfed.config.files import (
    from_mapping,
    nest_dotted_keys,
    parse_override,
    read_table_file,
    set_path,
    to_plain,
)
from rayfed.util.documented import documented, reference, section
from rayfed.util.errors import CheckpointError, ConfigError
from rayfed.util.registry import closest
from rayfed.util.validation import check, check_choice, check_int, check_real, is_int

__all__ = [
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "AlgorithmConfig",
    "EngineConfig",
    "RunConfig",
    "load_config",
    "read_run_config",
    "read_table_file",
    "parse_override",
    "field_reference",
]


@section("data")
@dataclass(frozen=True)
class DataConfig:
    """Which dataset, how it is split over clients, and how each client splits its share.

    Defaults follow the PFLlib generators behind the cwFedAvg papers: 20 clients,
    Dirichlet(0.1), 75/25 train/test per client, partition seed 1.
    """

    dataset: str = documented("synthetic", "A registered dataset (rayfed list): synthetic (offline), mnist, ...")
    root: str | None = documented(None, "Folder holding the dataset files (torchvision layout; for pfllib the "
                                        "folder a PFLlib generator wrote); unused by synthetic.")
    download: bool = documented(False, "Let torchvision download missing files (needs network).")
    options: Mapping[str, Any] = documented(
        {}, 'Dataset-specific options, e.g. {"num_samples": 20000} for synthetic.'
    )
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
        from rayfed.data.partitioners import PARTITIONERS  # registers the partitioners; no cycle back
        from rayfed.data.pfllib_folder import PFLLIB

        check(isinstance(self.dataset, str) and bool(self.dataset), "data.dataset", self.dataset, "a dataset name")
        check_int("data.num_clients", self.num_clients, low=1)
        check_choice("data.partition", self.partition, PARTITIONERS.names())
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


@section("model")
@dataclass(frozen=True)
class ModelConfig:
    """The network each client trains."""

    name: str = documented("cnn4", "A registered model (rayfed list): cnn4 (the papers' 4-layer CNN), resnet20, ...")
    client_models: tuple[str, ...] = documented(
        (), "Heterogeneous clients (FedClassAvg): client c gets client_models[c % len]; empty = every client uses name."
    )
    init: str = documented(
        "derived",
        "How the common initial model is drawn from the run seed: derived (from a stream of the seed kept apart "
        "from every other draw) or torch_seed (torch.manual_seed(seed) right before the model is built, as the "
        "cwFedAvg authors' code does, so that seed s starts from the model their run with -seed s starts from).",
    )

    def __post_init__(self) -> None:
        check(isinstance(self.name, str) and bool(self.name), "model.name", self.name, "a model name")
        check_choice("model.init", self.init, ("derived", "torch_seed"))
        object.__setattr__(self, "client_models", tuple(self.client_models))

    def architectures(self) -> tuple[str, ...]:
        """Every distinct architecture in the run, in first-use order."""
        return tuple(dict.fromkeys(self.client_models or (self.name,)))


@section("train")
@dataclass(frozen=True)
class TrainConfig:
    """Rounds and local training. Defaults: the cwFedAvg papers (SGD, lr 0.005, batch 10, 1 epoch)."""

    rounds: int = documented(100, "Communication rounds.")
    local_epochs: int = documented(1, "Epochs of local SGD per client per round.")
    batch_size: int = documented(10, "Mini-batch size of local SGD.")
    lr: float = documented(0.005, "Learning rate of local SGD (of round 0, with lr_decay).")
    momentum: float = documented(0.0, "SGD momentum in [0, 1) (FedAWA's clients use 0.9).")
    weight_decay: float = documented(0.0, "L2 weight decay of local SGD (FedAWA's clients use 5e-4).")
    lr_decay: float = documented(1.0, "Per-round multiplicative learning-rate decay in (0, 1] (FedAWA's code: 0.99).")
    drop_last: bool = documented(
        True,
        "Drop the last incomplete mini-batch, as PFLlib does; a client with fewer than batch_size training "
        "samples then takes no step (warned about before the run; refused when no client can step).",
    )

    def __post_init__(self) -> None:
        check(self.rounds >= 1, "train.rounds", self.rounds, ">= 1")
        check(self.local_epochs >= 1, "train.local_epochs", self.local_epochs, ">= 1")
        check(self.batch_size >= 1, "train.batch_size", self.batch_size, ">= 1")
        check(self.lr > 0 and math.isfinite(self.lr), "train.lr", self.lr, "a finite number > 0")
        check(0 <= self.momentum < 1, "train.momentum", self.momentum, "in [0, 1)")
        check(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, ">= 0")
        check(0 < self.lr_decay <= 1, "train.lr_decay", self.lr_decay, "in (0, 1]")

    def lr_at(self, round_index: int) -> float:
        """Learning rate of round ``round_index`` (0-based) after decay."""
        return self.lr * self.lr_decay**round_index


@section("algorithm")
@dataclass(frozen=True)
class AlgorithmConfig:
    """Which algorithm runs, by registered name, with its own hyper-parameters.

    ``name`` picks the algorithm (its server half and, by default, its client half).
    ``client`` optionally takes the client half of another algorithm, e.g. FedAWA's
    server with FedProx's local objective: ``name="fedawa", client="fedprox"``.
    ``params`` holds the server algorithm's hyper-parameters, ``client_params``
    the other client half's. Both are validated into the algorithm's frozen params
    dataclass at construction, so ``algorithm.params.wdr_lambda`` is a typed field.
    """

    name: str = documented("fedavg", "A registered algorithm (rayfed list): fedavg, fedprox, cwfedavg, fedawa, ...")
    params: Any = documented({}, "The algorithm's own hyper-parameters, e.g. algorithm.params.wdr_lambda (cwfedavg).")
    client: str | None = documented(
        None, "Borrow another algorithm's client half (local objective), e.g. fedprox or sgdm; null = name's own."
    )
    client_params: Any = documented({}, "Hyper-parameters of the borrowed client half (needs client).")

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _build_params(self.name, self.params, "algorithm.params", "name"))
        if self.client is not None:
            from rayfed.algorithms import ALGORITHMS  # registry import is lazy: algorithms import config

            check_choice("algorithm.client", self.client, ALGORITHMS.names())
            if ALGORITHMS.get(self.client).client_half is None:
                raise ConfigError(f"algorithm.client={self.client!r} has no client half to borrow")
            params = _build_params(self.client, self.client_params, "algorithm.client_params", "client")
            object.__setattr__(self, "client_params", params)
        elif self.client_params:
            raise ConfigError(
                "algorithm.client_params is set but algorithm.client is not; name the algorithm whose client half "
                f"takes them (got algorithm.client_params={dict(self.client_params)!r})"
            )


def _build_params(owner: str, value: Any, path: str, selector: str) -> Any:
    """``value`` as the params dataclass of algorithm ``owner`` (chosen by ``algorithm.{selector}``).

    A key ``owner`` does not take names the algorithms that do take it.
    """
    from rayfed.algorithms import ALGORITHMS

    params_type = ALGORITHMS.get(owner).params_type
    if isinstance(value, params_type):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path} must be a table of {params_type.__name__} fields, but got {path}={value!r}")
    known = _param_names(params_type)
    for key in value:
        if key not in known:
            takers = [name for name in ALGORITHMS if key in _param_names(ALGORITHMS.get(name).params_type)]
            hint = f"; {key} is a parameter of {', '.join(map(repr, takers))}" if takers else closest(str(key), known)
            raise ConfigError(
                f"unknown config key '{path}.{key}': algorithm.{selector}={owner!r} takes "
                f"{', '.join(known) if known else 'no parameters'}{hint}"
            )
    return from_mapping(params_type, value, path)


def _param_names(params_type: type) -> list[str]:
    return [f.name for f in dataclasses.fields(params_type)]


@section("engine")
@dataclass(frozen=True)
class EngineConfig:
    """How the simulation is laid out on Ray: workers, resources, sampling, evaluation, checkpoints."""

    backend: str = documented("ray", "ray (worker actors) or local (everything in this process, for debugging).")
    num_workers: int = documented(0, "ClientWorker actors; 0 = as many as the cluster's CPUs allow.")
    num_cpus_per_worker: float = documented(1.0, "CPUs Ray reserves for each worker.")
    num_gpus_per_worker: float = documented(
        0.0, "Fractional GPUs per worker, e.g. 0.25 = four workers per GPU; 0 = CPU only."
    )
    torch_threads: int = documented(1, "torch intra-op threads per worker; one per worker CPU avoids oversubscription.")
    clients_per_call: int = documented(
        0,
        "Clients per worker call; 0 = at least 8 calls of at most 64 clients. The batches never depend on "
        "num_workers or the backend, so the same config gives the same numbers on local and on any Ray cluster.",
    )
    vectorize: str = documented(
        "auto",
        "Train clients of one architecture stacked, as one model as many times as wide (grouped convolutions, "
        "batched products): on, off, or auto (stacked on CUDA, sequential on CPU: benchmarks/README.md).",
    )
    stack_size: int = documented(64, "Most clients trained in one stack (bounds the memory of a vectorised step).")
    cuda_graphs: bool = documented(
        True, "On a GPU, capture each training step once per shape as a CUDA graph and replay it (off: run eagerly)."
    )
    join_ratio: float = documented(1.0, "Fraction of clients sampled each round (partial participation when < 1).")
    eval_every: int = documented(1, "Evaluate every this many rounds (and always after the last).")
    eval_clients: str = documented("all", "Evaluate all clients (as the papers do) or only the sampled ones.")
    eval_initial: bool = documented(
        False,
        "Evaluate the initial model before any training, as the papers' code does (its round 0); stored as the "
        "row round=-1 of rounds.parquet, so the curves start where the authors' logs start.",
    )
    eval_train_loss: bool = documented(
        False,
        "Each round, also measure train_loss_eval: the cross-entropy of every sampled client's starting model "
        "for the round over its own train split, sample-weighted, without regulariser terms (the 'train loss' "
        "of the papers' logs; costs one forward pass over the training data).",
    )
    eval_local: bool = documented(
        False,
        "Each round, also evaluate every sampled client's model right after its local training, before the "
        "server aggregates, on its own test split (rounds.parquet local_accuracy and local_acc_mean; costs one "
        "forward pass over the sampled clients' test data).",
    )
    checkpoint_every: int = documented(10, "Checkpoint every this many rounds (and after the last); 0 = never.")
    ray_address: str | None = documented(
        None, "Ray cluster to join; null = join RAY_ADDRESS if set, else start a local Ray."
    )
    resource_wait_s: float = documented(
        0.0, "Seconds to wait for an autoscaling Ray cluster to add nodes the workers need; 0 = refuse at once."
    )
    dashboard: bool = documented(False, "Start the Ray dashboard with the local Ray.")
    dashboard_host: str = documented("127.0.0.1", "Address the Ray dashboard binds to (localhost only by default).")
    round_timeout_s: float | None = documented(
        None, "Seconds a worker call may take before it is treated as hung and re-run elsewhere; null = no limit."
    )
    max_update_norm: float | None = documented(
        None, "Reject a client update whose L2 distance from its starting point exceeds this bound; null = no bound."
    )
    max_retries: int = documented(
        2,
        "Times a batch of clients is re-run on a fresh worker after its worker died or hung, and times a round's "
        "aggregation is re-run on a fresh ServerActor after the server died; then the run stops with an error "
        "naming what failed and the round.",
    )
    client_state_memory_mb: float = documented(
        2048.0, "Memory for per-client state on the driver; beyond it, states spill to the run directory."
    )
    progress: bool = documented(True, "Show a progress bar over rounds.")

    def __post_init__(self) -> None:
        check_choice("engine.backend", self.backend, ("ray", "local"))
        check(self.num_workers >= 0, "engine.num_workers", self.num_workers, ">= 0")
        check(self.num_cpus_per_worker > 0, "engine.num_cpus_per_worker", self.num_cpus_per_worker, "> 0")
        check(self.num_gpus_per_worker >= 0, "engine.num_gpus_per_worker", self.num_gpus_per_worker, ">= 0")
        check(self.torch_threads >= 1, "engine.torch_threads", self.torch_threads, ">= 1")
        check(self.clients_per_call >= 0, "engine.clients_per_call", self.clients_per_call, ">= 0")
        check_choice("engine.vectorize", self.vectorize, ("auto", "on", "off"))
        check(self.stack_size >= 1, "engine.stack_size", self.stack_size, ">= 1")
        check(0 < self.join_ratio <= 1, "engine.join_ratio", self.join_ratio, "in (0, 1]")
        check(self.eval_every >= 1, "engine.eval_every", self.eval_every, ">= 1")
        check_choice("engine.eval_clients", self.eval_clients, ("all", "sampled"))
        check(isinstance(self.eval_initial, bool), "engine.eval_initial", self.eval_initial, "true or false")
        check(isinstance(self.eval_train_loss, bool), "engine.eval_train_loss", self.eval_train_loss, "true or false")
        check(isinstance(self.eval_local, bool), "engine.eval_local", self.eval_local, "true or false")
        check(self.checkpoint_every >= 0, "engine.checkpoint_every", self.checkpoint_every, ">= 0 (0 = never)")
        if self.round_timeout_s is not None:
            check(self.round_timeout_s > 0, "engine.round_timeout_s", self.round_timeout_s, "> 0 or unset")
        check(self.max_retries >= 0, "engine.max_retries", self.max_retries, ">= 0")
        check(self.resource_wait_s >= 0, "engine.resource_wait_s", self.resource_wait_s, ">= 0")
        check(self.client_state_memory_mb > 0, "engine.client_state_memory_mb", self.client_state_memory_mb, "> 0")
        if self.max_update_norm is not None:
            check(self.max_update_norm > 0, "engine.max_update_norm", self.max_update_norm, "> 0 or unset")


@section("")
@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run. Saved as ``config.json`` in the run directory."""

    data: DataConfig = documented(DataConfig, "Dataset, partition over clients, train/test split (DataConfig).")
    model: ModelConfig = documented(ModelConfig, "The clients' network (ModelConfig).")
    train: TrainConfig = documented(TrainConfig, "Rounds and local SGD (TrainConfig).")
    algorithm: AlgorithmConfig = documented(AlgorithmConfig, "The algorithm and its parameters (AlgorithmConfig).")
    engine: EngineConfig = documented(EngineConfig, "Workers, sampling, evaluation, checkpoints (EngineConfig).")
    seed: int = documented(0, "Training seed: model initialisation, client sampling and mini-batch order.")
    run_dir: str | None = documented(None, "Where results go; null = runs/<algorithm>-<dataset>-s<seed>-<time>.")

    def __post_init__(self) -> None:
        check(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "an integer >= 0")

    # --- conversions -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready nested dict; ``RunConfig.from_dict(cfg.to_dict()) == cfg``."""
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """Build from nested mappings; unknown keys raise ConfigError with the closest known key."""
        return from_mapping(cls, data, "")

    def override(self, overrides: Mapping[str, Any]) -> RunConfig:
        """A copy with fields replaced by dotted path, e.g. ``{"algorithm.params.wdr_lambda": 100}``.

        Another ``algorithm.name`` (or ``algorithm.client``) starts from that algorithm's
        default params unless ``overrides`` sets them: the old ones belong to the old algorithm.

        >>> cw = RunConfig().override({"algorithm.name": "cwfedavg", "algorithm.params.wdr_lambda": 100})
        >>> cw.override({"algorithm.name": "fedprox"}).algorithm.params
        FedProxParams(mu=0.001)
        """
        tree = self.to_dict()
        for selector, params in (("name", "params"), ("client", "client_params")):
            key = f"algorithm.{selector}"
            changed = key in overrides and overrides[key] != getattr(self.algorithm, selector)
            if changed and not any(path.startswith(f"algorithm.{params}") for path in overrides):
                tree["algorithm"][params] = {}
        for path, value in overrides.items():
            set_path(tree, path, value)
        return RunConfig.from_dict(tree)

    @classmethod
    def of(cls, config: RunConfig | Mapping[str, Any]) -> RunConfig:
        """``config`` itself, or the default config overridden by a mapping of dotted field paths, as
        :meth:`override` takes it (``{"train.lr": 0.01}``); ConfigError naming the fix for anything else.

        >>> RunConfig.of({"train.lr": 0.01, "data": {"num_clients": 5}}).data.num_clients
        5
        """
        if isinstance(config, RunConfig):
            return config
        if isinstance(config, Mapping) and all(isinstance(key, str) for key in config):
            return cls().override(config)
        raise ConfigError(
            f"a run takes a RunConfig, or a mapping of dotted field paths such as {{'train.lr': 0.01}}, but got "
            f"{type(config).__name__} {config!r:.80}; build one with RunConfig().override({{...}}) or "
            "rayfed.load_config(path)"
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def diff(self, other: RunConfig, *, ignore: tuple[str, ...] = ()) -> list[str]:
        """Fields that differ, as ``"path: old -> new"`` lines, skipping paths that start with ``ignore``.

        The one comparison behind every "same run?" question: resuming a run directory,
        resuming an Optuna study.

        >>> RunConfig().diff(RunConfig().override({"train.lr": 0.1, "train.rounds": 5}), ignore=("train.rounds",))
        ['train.lr: 0.005 -> 0.1']
        """
        return [d for d in _differences(self.to_dict(), other.to_dict()) if not d.startswith(ignore)]


def _differences(old: Any, new: Any, path: str = "") -> list[str]:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        keys = sorted(set(old) | set(new))
        return [d for key in keys for d in _differences(old.get(key), new.get(key), f"{path}{key}.")]
    return [] if old == new else [f"{path.rstrip('.')}: {old!r} -> {new!r}"]


def field_reference() -> str:
    """Every config field as ``path = default`` and its meaning (``rayfed run --help`` prints it)."""
    return reference(RunConfig)


def read_run_config(path: str | Path) -> RunConfig:
    """The config a run saved (its ``config.json``); CheckpointError naming the file if it cannot be read."""
    try:
        return RunConfig.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
    except (ValueError, OSError) as error:  # ConfigError is a ValueError
        raise CheckpointError(
            f"{str(path)!r} is not a readable run config ({error}); restore it from a copy, or choose another run_dir"
        ) from error


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Read a TOML, YAML or JSON config file and apply dotted-path overrides.

    The file names fields by nested tables, flat dotted keys (``"train.lr" = 0.02``), or both.
    """
    config = RunConfig.from_dict(nest_dotted_keys(read_table_file(path), f"config file {str(path)!r}"))
    return config.override(overrides) if overrides else config
