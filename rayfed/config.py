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


def _fail(path: str, value: Any, allowed: str) -> typing.NoReturn:
    raise ConfigError(f"{path} must be {allowed}, but got {path}={value!r}")


def _check(ok: bool, path: str, value: Any, allowed: str) -> None:
    if not ok:
        _fail(path, value, allowed)


def _check_choice(path: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(
            f"{path} must be one of {', '.join(map(repr, choices))}, but got {path}={value!r}"
            f"{closest(str(value), choices)}"
        )


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
    partition: str = "dirichlet"
    alpha: float = 0.1
    """Dirichlet concentration (``partition="dirichlet"``)."""
    classes_per_client: int = 2
    """Classes per client (``partition="pathological"``)."""
    min_samples: int = 1
    """Dirichlet: redraw until every client holds at least this many samples."""
    balance: bool = False
    """Pathological: equal block sizes instead of PFLlib's random sizes."""
    train_fraction: float = 0.75
    seed: int = 1
    """Partition seed; fixed across the training seeds, as in the papers."""

    def __post_init__(self) -> None:
        _check(isinstance(self.dataset, str) and bool(self.dataset), "data.dataset", self.dataset, "a dataset name")
        _check(self.num_clients >= 1, "data.num_clients", self.num_clients, ">= 1")
        _check_choice("data.partition", self.partition, ("iid", "pathological", "dirichlet"))
        _check(self.alpha > 0 and math.isfinite(self.alpha), "data.alpha", self.alpha, "a finite number > 0")
        _check(self.classes_per_client >= 1, "data.classes_per_client", self.classes_per_client, ">= 1")
        _check(self.min_samples >= 0, "data.min_samples", self.min_samples, ">= 0")
        _check(0 < self.train_fraction < 1, "data.train_fraction", self.train_fraction, "in (0, 1)")
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
        _check(isinstance(self.name, str) and bool(self.name), "model.name", self.name, "a model name")
        object.__setattr__(self, "client_models", tuple(self.client_models))

    def for_client(self, client_id: int) -> str:
        """Architecture name of ``client_id``."""
        if self.client_models:
            return self.client_models[client_id % len(self.client_models)]
        return self.name

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
        _check(self.rounds >= 1, "train.rounds", self.rounds, ">= 1")
        _check(self.local_epochs >= 1, "train.local_epochs", self.local_epochs, ">= 1")
        _check(self.batch_size >= 1, "train.batch_size", self.batch_size, ">= 1")
        _check(self.lr > 0 and math.isfinite(self.lr), "train.lr", self.lr, "a finite number > 0")
        _check(0 <= self.momentum < 1, "train.momentum", self.momentum, "in [0, 1)")
        _check(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, ">= 0")
        _check(0 < self.lr_decay <= 1, "train.lr_decay", self.lr_decay, "in (0, 1]")

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
    (stacked on CUDA, sequential on CPU, where stacking measured slower)."""
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
    client_state_memory_mb: float = 2048.0
    """Memory for per-client state on the driver; beyond it, states spill to the run directory."""
    progress: bool = True

    def __post_init__(self) -> None:
        _check_choice("engine.backend", self.backend, ("ray", "local"))
        _check(self.num_workers >= 0, "engine.num_workers", self.num_workers, ">= 0")
        _check(self.num_cpus_per_worker > 0, "engine.num_cpus_per_worker", self.num_cpus_per_worker, "> 0")
        _check(self.num_gpus_per_worker >= 0, "engine.num_gpus_per_worker", self.num_gpus_per_worker, ">= 0")
        _check(self.torch_threads >= 1, "engine.torch_threads", self.torch_threads, ">= 1")
        _check(self.clients_per_call >= 0, "engine.clients_per_call", self.clients_per_call, ">= 0")
        _check_choice("engine.vectorize", self.vectorize, ("auto", "on", "off"))
        _check(self.stack_size >= 1, "engine.stack_size", self.stack_size, ">= 1")
        _check(0 < self.join_ratio <= 1, "engine.join_ratio", self.join_ratio, "in (0, 1]")
        _check(self.eval_every >= 1, "engine.eval_every", self.eval_every, ">= 1")
        _check_choice("engine.eval_clients", self.eval_clients, ("all", "sampled"))
        _check(self.checkpoint_every >= 0, "engine.checkpoint_every", self.checkpoint_every, ">= 0 (0 = never)")
        if self.round_timeout_s is not None:
            _check(self.round_timeout_s > 0, "engine.round_timeout_s", self.round_timeout_s, "> 0 or unset")
        _check(self.client_state_memory_mb > 0, "engine.client_state_memory_mb", self.client_state_memory_mb, "> 0")
        if self.max_update_norm is not None:
            _check(self.max_update_norm > 0, "engine.max_update_norm", self.max_update_norm, "> 0 or unset")


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
        _check(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "an integer >= 0")

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
        _fail(path, value, "true or false")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            _fail(path, value, "an integer")
        try:
            as_float = float(value)
        except ValueError:
            _fail(path, value, "an integer")
        if not as_float.is_integer():
            _fail(path, value, "an integer")
        return int(as_float)
    if hint is float:
        if isinstance(value, bool):
            _fail(path, value, "a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            _fail(path, value, "a number")
    if hint is str:
        if not isinstance(value, str):
            _fail(path, value, "a string")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        return tuple(value)
    if origin is Literal:
        _check_choice(path, value, get_args(hint))
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
