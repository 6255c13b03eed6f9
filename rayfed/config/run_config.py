"""One typed, validated configuration object per run.

``RunConfig`` is a tree of frozen dataclasses. Its sections live beside the code that reads them
(:mod:`rayfed.data.settings`, :mod:`rayfed.train.settings`, :mod:`rayfed.algorithms.settings`; the model and
engine sections, read only above the config, stay here), and it checks, above them all, the names that refer
to registries (``data.partition``). Every field is checked when the object
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
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayfed.algorithms.settings import AlgorithmConfig
from rayfed.config.retired import refuse_retired, without_retired
from rayfed.config.trackers import TRACKERS
from rayfed.data.partitioners import PARTITIONERS
from rayfed.data.settings import DataConfig
from rayfed.privacy.settings import PrivacyConfig
from rayfed.system.settings import SystemConfig
from rayfed.train.settings import TrainConfig
from rayfed.util.config_tree import (
    coerce,
    from_mapping,
    nest_dotted_keys,
    parse_override,
    read_table_file,
    set_path,
    to_plain,
    tree_differences,
)
from rayfed.util.documented import documented, reference, section
from rayfed.util.errors import ConfigError
from rayfed.util.plugin_sources import import_plugins
from rayfed.util.seeding import PARTICIPATION
from rayfed.util.validation import check, check_choice

__all__ = ["DataConfig", "ModelConfig", "TrainConfig", "AlgorithmConfig", "EngineConfig", "SystemConfig", "RunConfig"]
__all__ += ["load_config", "read_table_file", "parse_override", "field_reference", "is_field_path", "TRACKERS"]


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


@section("engine")
@dataclass(frozen=True)
class EngineConfig:
    """How the simulation is laid out on Ray: workers, resources, sampling, evaluation, checkpoints."""

    backend: str = documented("ray", "ray (worker actors) or local (everything in this process, for debugging).")
    num_workers: int = documented(
        0,
        "ClientWorker actors; 0 = as many as the cluster's nodes hold, following nodes as they join and leave "
        "(docs/cluster.md, 'Nodes that come and go').",
    )
    max_workers: int = documented(0, "With num_workers=0, the most ClientWorkers the pool grows to; 0 = no bound.")
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
    pack_lanes: bool = documented(
        False, "Pack a stack's clients into fewer lanes, a lane taking the next client when one ends (same numbers)."
    )
    cuda_graphs: bool = documented(
        True, "On a GPU, capture each training step once per shape as a CUDA graph and replay it (off: run eagerly)."
    )
    join_ratio: float = documented(1.0, "Fraction of clients sampled each round (partial participation when < 1).")
    participation: str = documented(
        "fixed",
        "How a round samples: fixed (⌊join_ratio·M⌋ clients drawn without replacement) or poisson (each client "
        "joins independently with probability join_ratio, the DP-FedAvg paper's sampling; a round may take none).",
    )
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
        0.0,
        "Seconds to wait for an autoscaling Ray cluster to add nodes the workers need, at the start and when a run "
        "has lost every worker; 0 = stop at once.",
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
    loggers: tuple[str, ...] = documented(
        (),
        "Experiment trackers that also receive the run (README.md, 'Experiment tracking'): any of tensorboard, "
        "mlflow, wandb, each installed with its extra (pip install 'rayfed[tensorboard]'); every round's metrics, "
        "the config as hyper-parameters, per-client distributions and, when the run ends, its figures.",
    )

    def __post_init__(self) -> None:
        check_choice("engine.backend", self.backend, ("ray", "local"))
        check(self.num_workers >= 0, "engine.num_workers", self.num_workers, ">= 0")
        check(self.max_workers >= 0, "engine.max_workers", self.max_workers, ">= 0 (0 = no bound)")
        check(
            not (self.num_workers and self.max_workers),
            "engine.max_workers",
            self.max_workers,
            f"0 while engine.num_workers={self.num_workers} fixes the pool's size (or set engine.num_workers=0)",
        )
        check(self.num_cpus_per_worker > 0, "engine.num_cpus_per_worker", self.num_cpus_per_worker, "> 0")
        check(self.num_gpus_per_worker >= 0, "engine.num_gpus_per_worker", self.num_gpus_per_worker, ">= 0")
        check(self.torch_threads >= 1, "engine.torch_threads", self.torch_threads, ">= 1")
        check(self.clients_per_call >= 0, "engine.clients_per_call", self.clients_per_call, ">= 0")
        check_choice("engine.vectorize", self.vectorize, ("auto", "on", "off"))
        check(self.stack_size >= 1, "engine.stack_size", self.stack_size, ">= 1")
        check(0 < self.join_ratio <= 1, "engine.join_ratio", self.join_ratio, "in (0, 1]")
        check_choice("engine.participation", self.participation, PARTICIPATION)
        check(self.eval_every >= 1, "engine.eval_every", self.eval_every, ">= 1")
        check_choice("engine.eval_clients", self.eval_clients, ("all", "sampled"))
        for flag in ("pack_lanes", "eval_initial", "eval_train_loss", "eval_local"):
            check(isinstance(getattr(self, flag), bool), f"engine.{flag}", getattr(self, flag), "true or false")
        check(self.checkpoint_every >= 0, "engine.checkpoint_every", self.checkpoint_every, ">= 0 (0 = never)")
        if self.round_timeout_s is not None:
            check(self.round_timeout_s > 0, "engine.round_timeout_s", self.round_timeout_s, "> 0 or unset")
        check(self.max_retries >= 0, "engine.max_retries", self.max_retries, ">= 0")
        check(self.resource_wait_s >= 0, "engine.resource_wait_s", self.resource_wait_s, ">= 0")
        check(self.client_state_memory_mb > 0, "engine.client_state_memory_mb", self.client_state_memory_mb, "> 0")
        if self.max_update_norm is not None:
            check(self.max_update_norm > 0, "engine.max_update_norm", self.max_update_norm, "> 0 or unset")
        for name in self.loggers:
            check_choice("engine.loggers", name, TRACKERS)
        check(len(set(self.loggers)) == len(self.loggers), "engine.loggers", list(self.loggers), "each tracker once")

    def workers_for(self, room: int) -> int:
        """The pool's size on nodes with ``room`` for that many workers: ``num_workers``, or with 0 every worker
        the room holds, up to ``max_workers``; never more than ``room``."""
        return min(self.num_workers or self.max_workers or room, room)


@section("")
@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run. Saved as ``config.json`` in the run directory."""

    data: DataConfig = documented(DataConfig, "Dataset, partition over clients, train/test split (DataConfig).")
    model: ModelConfig = documented(ModelConfig, "The clients' network (ModelConfig).")
    train: TrainConfig = documented(TrainConfig, "Rounds and local SGD (TrainConfig).")
    algorithm: AlgorithmConfig = documented(AlgorithmConfig, "The algorithm and its parameters (AlgorithmConfig).")
    engine: EngineConfig = documented(EngineConfig, "Workers, sampling, evaluation, checkpoints (EngineConfig).")
    system: SystemConfig = documented(
        SystemConfig,
        "The clients' devices, when they are online, deadlines and the virtual clock (SystemConfig, "
        "docs/system.md); off by default.",
    )
    privacy: PrivacyConfig = documented(PrivacyConfig, "DP-FedAvg (PrivacyConfig, docs/privacy.md); off by default.")
    seed: int = documented(0, "Training seed: model initialisation, client sampling and mini-batch order.")
    run_dir: str | None = documented(None, "Where results go; null = runs/<algorithm>-<dataset>-s<seed>-<time>.")
    plugins: tuple[str, ...] = documented(
        (),
        "Modules (my_methods) or .py files that register methods, models, datasets or partitioners of your own, "
        "imported before the config's names are looked up, in every process (docs/architecture.md, 'A method "
        "of your own'). A run records the modules that registered what it uses here.",
    )

    def __post_init__(self) -> None:
        check_choice("data.partition", self.data.partition, PARTITIONERS.names())
        check(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "an integer >= 0")
        poisson, devices = self.engine.participation == "poisson", self.system.devices
        why = f"'fixed' with system.devices={devices!r} (a round samples a fixed number among the clients online)"
        check(not (poisson and self.system.enabled), "engine.participation", self.engine.participation, why)
        object.__setattr__(self, "plugins", tuple(self.plugins))

    # --- conversions -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready nested dict; ``RunConfig.from_dict(cfg.to_dict()) == cfg``."""
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, strict: bool = False) -> RunConfig:
        """Build from nested mappings a user gave (a config file, the command line, Python); unknown keys raise
        ConfigError with the closest known key, and retired ones (:mod:`rayfed.config.retired`) with what replaced
        them. The ``plugins`` are imported first: the names the sections check may be theirs. ``strict``: the
        values come from a typed file, where a number written as a string is refused
        (:func:`rayfed.util.config_tree.coerce`)."""
        refuse_retired(data)
        import_plugins(_plugin_entries(data))
        return from_mapping(cls, data, "", strict=strict)

    @classmethod
    def from_saved(cls, data: Mapping[str, Any]) -> RunConfig:
        """A config rayfed saved (``config.json``, a study's base config), read as data: its ``plugins`` are not
        imported (a run directory or a study runs no code when read: :mod:`rayfed.provenance.run_seal` says when a
        resume may import them), so a name only a plugin registers is refused here unless this process holds it.
        Keys since retired (:mod:`rayfed.config.retired`) are left out; none of them changed a run's numbers."""
        data = without_retired(data)
        _plugin_entries(data)
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
        if "plugins" in overrides:  # the entries given now are imported; those the config held already were
            import_plugins(_plugin_entries({"plugins": overrides["plugins"]}))
        refuse_retired(tree)
        return from_mapping(RunConfig, tree, "")

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
        return tree_differences(self.to_dict(), other.to_dict(), ignore=ignore)


def _plugin_entries(data: Mapping[str, Any]) -> tuple[str, ...]:
    """``data``'s ``plugins``, as a list field is read (``[a.py, b]`` or ``a.py`` on the command line); ConfigError
    naming the field for anything else."""
    entries = data.get("plugins", ()) if isinstance(data, Mapping) else ()
    if isinstance(entries, str):
        entries = coerce(tuple[str, ...], entries, "plugins")
    if not isinstance(entries, list | tuple) or not all(isinstance(entry, str) and entry for entry in entries):
        raise ConfigError(
            f"plugins must be a list of module names or .py files, but got plugins={entries!r}; "
            'e.g. plugins = ["my_methods"], or plugins=my_methods.py on the command line'
        )
    return tuple(entries)


def is_field_path(path: str) -> bool:
    """Whether ``path`` (``train.lr``) names a config field, or a key inside a table field (``algorithm.params.*``,
    ``data.options.*``).

    >>> is_field_path("train.lr"), is_field_path("algorithm.params.wdr_lambda"), is_field_path("a")
    (True, True, False)
    """
    node: Any = RunConfig
    for key in path.split("."):
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            return node is Any or typing.get_origin(node) in (Mapping, dict)  # inside a table, or below a value
        fields = typing.get_type_hints(node)
        if key not in fields:
            return False
        node = fields[key]
    return True


def field_reference() -> str:
    """Every config field as ``path = default`` and its meaning (``rayfed run --help`` prints it)."""
    return reference(RunConfig)


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Read a TOML, YAML or JSON config file and apply dotted-path overrides.

    The file names fields by nested tables, flat dotted keys (``"train.lr" = 0.02``), or both, each value of
    its field's type (``lr = "0.01"`` is refused, naming the field). A file that sets no field is refused: it
    can only be a mistake (the wrong file, a write cut short), since leaving it out runs on the defaults.
    """
    table = read_table_file(path)
    if not table:
        raise ConfigError(
            f"config file {str(path)!r} is empty (it sets no field); write in it the fields to change, or leave it "
            "out to run on the defaults"
        )
    config = RunConfig.from_dict(nest_dotted_keys(table, f"config file {str(path)!r}"), strict=True)
    return config.override(overrides) if overrides else config
