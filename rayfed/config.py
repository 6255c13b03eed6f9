"""One typed, validated configuration object per run.

``RunConfig`` is a tree of frozen dataclasses. Every field is checked when the object
is built, and a bad value raises :class:`~rayfed.errors.ConfigError` naming the field
(as a dotted path such as ``train.lr``), the value received and what is allowed. The
same object runs from Python (:func:`rayfed.run`), from the command line
(``rayfed run config.toml train.lr=0.01``) and inside an Optuna trial, which
overrides fields by the same dotted paths.

>>> cfg = RunConfig().override({"train.lr": 0.01, "data.num_clients": 10})
>>> cfg.train.lr, cfg.data.num_clients
(0.01, 10)
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from rayfed.errors import ConfigError
from rayfed.registry import closest
from rayfed.validation import check, check_choice, check_int, check_real, fail, is_int

__all__ = [
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "AlgorithmConfig",
    "EngineConfig",
    "RunConfig",
    "load_config",
    "read_table_file",
    "parse_override",
]


@dataclass(frozen=True)
class DataConfig:
    """Which dataset, how it is split over clients, and how each client splits its share.

    Defaults follow the PFLlib generators behind the cwFedAvg papers: 20 clients,
    Dirichlet(0.1), 75/25 train/test per client, partition seed 1.
    """

    dataset: str = "synthetic"
    root: str | None = None
    """Folder holding the dataset files (torchvision layout); unused by ``synthetic``."""
    download: bool = False
    """Let torchvision download missing files (needs network)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Dataset-specific options, e.g. ``{"num_samples": 20000}`` for ``synthetic``."""
    num_clients: int = 20
    """M, the number of clients (at most the number of samples)."""
    partition: str = "dirichlet"
    """A partitioner registered in :data:`rayfed.data.PARTITIONERS`: ``"dirichlet"``, ``"pathological"``, ``"iid"``."""
    alpha: float = 0.1
    """Dirichlet concentration (``partition="dirichlet"``), > 0; smaller is more skewed."""
    classes_per_client: int = 2
    """Classes per client (``partition="pathological"``), at most the dataset's classes."""
    min_samples: int = 1
    """PFLlib's ``least_samples``: Dirichlet redraws until every client holds at least this many
    samples; the pathological partitioner uses it in its lower block-size bound. 0 allows empty clients."""
    balance: bool = False
    """Pathological: equal block sizes instead of PFLlib's random sizes."""
    train_fraction: float = 0.75
    """f in (0, 1): each client trains on floor(f * n_i) of its samples and tests on the rest. 1 is not
    allowed, because every client is evaluated on its own test split."""
    seed: int = 1
    """Partition seed, in [0, 2**32 - 1]; fixed across the training seeds, as in the papers."""

    def __post_init__(self) -> None:
        from rayfed.data.partitioners import PARTITIONERS  # registers the partitioners; no cycle back

        check(isinstance(self.dataset, str) and bool(self.dataset), "data.dataset", self.dataset, "a dataset name")
        check_int("data.num_clients", self.num_clients, low=1)
        check_choice("data.partition", self.partition, PARTITIONERS.names())
        check_real("data.alpha", self.alpha, low=0, low_open=True)
        check_int("data.classes_per_client", self.classes_per_client, low=1)
        check_int("data.min_samples", self.min_samples, low=0)
        check(isinstance(self.balance, bool), "data.balance", self.balance, "true or false")
        check_real("data.train_fraction", self.train_fraction, low=0, high=1, low_open=True, high_open=True)
        check(is_int(self.seed) and 0 <= self.seed < 2**32, "data.seed", self.seed, "an integer in [0, 2**32 - 1]")
        object.__setattr__(self, "options", dict(self.options))


@dataclass(frozen=True)
class ModelConfig:
    """The network each client trains.

    ``client_models`` gives heterogeneous clients (FedClassAvg): client ``c`` gets
    ``client_models[c % len(client_models)]``; empty means every client uses ``name``.
    """

    name: str = "cnn4"
    client_models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check(isinstance(self.name, str) and bool(self.name), "model.name", self.name, "a model name")
        object.__setattr__(self, "client_models", tuple(self.client_models))

    def architectures(self) -> tuple[str, ...]:
        """Every distinct architecture in the run, in first-use order."""
        return tuple(dict.fromkeys(self.client_models or (self.name,)))


@dataclass(frozen=True)
class TrainConfig:
    """Rounds and local training. Defaults: the cwFedAvg papers (SGD, lr 0.005, batch 10, 1 epoch)."""

    rounds: int = 100
    local_epochs: int = 1
    batch_size: int = 10
    lr: float = 0.005
    momentum: float = 0.0
    weight_decay: float = 0.0
    lr_decay: float = 1.0
    """Per-round multiplicative learning-rate decay (FedAWA's code uses 0.99)."""
    drop_last: bool = True
    """Drop the last incomplete mini-batch (PFLlib does; a client with < batch_size samples then makes no step)."""

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

    name: str = "fedavg"
    params: Any = field(default_factory=dict)
    client: str | None = None
    client_params: Any = field(default_factory=dict)

    def __post_init__(self) -> None:
        from rayfed.algorithms import ALGORITHMS  # registry import is lazy: algorithms import config

        algorithm = ALGORITHMS.get(self.name)
        object.__setattr__(self, "params", _build_params(algorithm.params_type, self.params, "algorithm.params"))
        if self.client is not None:
            other = ALGORITHMS.get(self.client)
            if other.client_half is None:
                raise ConfigError(f"algorithm.client={self.client!r} has no client half to borrow")
            object.__setattr__(
                self, "client_params", _build_params(other.params_type, self.client_params, "algorithm.client_params")
            )
        elif self.client_params:
            raise ConfigError(
                "algorithm.client_params is set but algorithm.client is not; name the algorithm whose client half "
                f"takes them (got algorithm.client_params={dict(self.client_params)!r})"
            )


def _build_params(params_type: type, value: Any, path: str) -> Any:
    if isinstance(value, params_type):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path} must be a table of {params_type.__name__} fields, but got {path}={value!r}")
    return _from_mapping(params_type, value, path)


@dataclass(frozen=True)
class EngineConfig:
    """How the simulation is laid out on Ray: workers, resources, sampling, evaluation, checkpoints."""

    backend: str = "ray"
    """``ray`` (worker actors) or ``local`` (everything in this process, for debugging and tests)."""
    num_workers: int = 0
    """ClientWorker actors; 0 = as many as the cluster's CPUs allow."""
    num_cpus_per_worker: float = 1.0
    num_gpus_per_worker: float = 0.0
    """Fractional GPUs per worker, e.g. 0.25 = four workers per GPU; 0 = CPU only."""
    torch_threads: int = 1
    """torch intra-op threads per worker; one per worker CPU avoids oversubscription."""
    clients_per_call: int = 0
    """Clients per worker call; 0 = split the sampled clients into 2 calls per worker."""
    vectorize: str = "auto"
    """Train clients of one architecture stacked with torch.func: ``on``, ``off``, or ``auto``
    (stacked on CUDA, sequential on CPU, where stacking is slower: benchmarks/README.md)."""
    stack_size: int = 64
    """Most clients trained in one stack (bounds the memory of a vectorised step)."""
    join_ratio: float = 1.0
    """Fraction of clients sampled each round (partial participation when < 1)."""
    eval_every: int = 1
    eval_clients: str = "all"
    """Evaluate ``all`` clients (as the papers do) or only the ``sampled`` ones."""
    checkpoint_every: int = 10
    ray_address: str | None = None
    """Ray cluster to join; None = join ``RAY_ADDRESS`` if set, else start a local Ray."""
    dashboard: bool = False
    dashboard_host: str = "127.0.0.1"
    round_timeout_s: float | None = None
    """Seconds a worker call may take before it is treated as hung and re-run elsewhere."""
    max_update_norm: float | None = None
    """Reject a client update whose L2 distance from its starting point exceeds this bound."""
    max_retries: int = 2
    """Times a batch of clients is re-run on a fresh worker after its worker died or hung;
    then the run stops with an error naming the worker, the clients and the round."""
    client_state_memory_mb: float = 2048.0
    """Memory for per-client state on the driver; beyond it, states spill to the run directory."""
    progress: bool = True

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
        check(self.checkpoint_every >= 0, "engine.checkpoint_every", self.checkpoint_every, ">= 0 (0 = never)")
        if self.round_timeout_s is not None:
            check(self.round_timeout_s > 0, "engine.round_timeout_s", self.round_timeout_s, "> 0 or unset")
        check(self.max_retries >= 0, "engine.max_retries", self.max_retries, ">= 0")
        check(self.client_state_memory_mb > 0, "engine.client_state_memory_mb", self.client_state_memory_mb, "> 0")
        if self.max_update_norm is not None:
            check(self.max_update_norm > 0, "engine.max_update_norm", self.max_update_norm, "> 0 or unset")


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run. Saved as ``config.json`` in the run directory."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    seed: int = 0
    """Training seed: model initialisation, client sampling and mini-batch order."""
    run_dir: str | None = None
    """Where results go; None = ``runs/<algorithm>-<dataset>-s<seed>-<time>``."""

    def __post_init__(self) -> None:
        check(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "an integer >= 0")

    # --- conversions -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready nested dict; ``RunConfig.from_dict(cfg.to_dict()) == cfg``."""
        return _to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """Build from nested mappings; unknown keys raise ConfigError with the closest known key."""
        return _from_mapping(cls, data, "")

    def override(self, overrides: Mapping[str, Any]) -> RunConfig:
        """A copy with fields replaced by dotted path, e.g. ``{"algorithm.params.wdr_lambda": 100}``."""
        tree = self.to_dict()
        for path, value in overrides.items():
            _set_path(tree, path, value)
        return RunConfig.from_dict(tree)

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


# --- mapping <-> dataclass ------------------------------------------------------------------


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return [_to_plain(v) for v in obj]
    return obj


def _from_mapping(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'} must be a table of fields, but got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise ConfigError(
                f"unknown config key {path!r}{closest(str(key), list(fields))}; "
                f"known keys{' of ' + prefix if prefix else ''}: {', '.join(fields)}"
            )
        kwargs[key] = _coerce(hints[key], value, path)
    try:
        return cls(**kwargs)
    except TypeError as e:  # a field without a default is missing
        raise ConfigError(f"{prefix or 'config'}: {e}") from e


def _coerce(hint: Any, value: Any, path: str) -> Any:
    """Convert ``value`` (from TOML, JSON or a command-line string) to the field's type."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        if isinstance(value, str) and value.lower() in ("none", "null") and type(None) in options:
            return None
        non_none = [o for o in options if o is not type(None)]
        return _coerce(non_none[0], value, path) if len(non_none) == 1 else value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return value if isinstance(value, hint) else _from_mapping(hint, value, path)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        fail(path, value, "true or false")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            fail(path, value, "an integer")
        try:
            as_float = float(value)
        except ValueError:
            fail(path, value, "an integer")
        if not as_float.is_integer():
            fail(path, value, "an integer")
        return int(as_float)
    if hint is float:
        if isinstance(value, bool):
            fail(path, value, "a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            fail(path, value, "a number")
    if hint is str:
        if not isinstance(value, str):
            fail(path, value, "a string")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        return tuple(value)
    if origin is Literal:
        check_choice(path, value, get_args(hint))
    return value


def parse_override(text: str) -> tuple[str, Any]:
    """Parse a command-line override ``path=value``; the value is read as JSON when it parses."""
    if "=" not in text:
        raise ConfigError(f"an override must look like field.path=value, but got {text!r}")
    path, raw = text.split("=", 1)
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return path.strip(), value


def _set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    node: Any = tree
    for depth, key in enumerate(keys[:-1]):
        if not isinstance(node, dict) or key not in node:
            known = list(node) if isinstance(node, dict) else []
            where = ".".join(keys[:depth]) or "config"
            raise ConfigError(f"unknown config key {path!r}: {where} has no field {key!r}{closest(key, known)}")
        if not isinstance(node[key], dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = value


def read_table_file(path: str | Path, kind: str = "config file") -> Any:
    """Parse a TOML, YAML or JSON file, by suffix; errors call the file a ``kind``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{kind} {str(path)!r} does not exist")
    text = path.read_text()
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            import tomllib

            return tomllib.loads(text)
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as e:
                raise ConfigError(f"YAML {kind}s need PyYAML: pip install 'rayfed[tune]'") from e
            return yaml.safe_load(text) or {}
        if suffix == ".json":
            return json.loads(text)
        raise ConfigError(f"{kind} {str(path)!r} must end in .toml, .yaml, .yml or .json")
    except ConfigError:
        raise
    except Exception as e:  # a syntax error in the file
        raise ConfigError(f"{kind} {str(path)!r} cannot be parsed: {e}") from e


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Read a TOML, YAML or JSON config file and apply dotted-path overrides."""
    config = RunConfig.from_dict(read_table_file(path))
    return config.override(overrides) if overrides else config
