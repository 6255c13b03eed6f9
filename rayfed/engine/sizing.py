"""Size before start: an estimate of the memory a run needs, checked before any data is made.

A config can ask for more memory than the machine has (ten million clients over ten
million synthetic samples); without a check the run fills memory for minutes and then
dies. :func:`estimate_memory` computes, from the config alone (nothing is generated,
loaded or allocated; the model is built on PyTorch's ``meta`` device), the bytes of what
dominates a run on the driver's machine:

* **dataset**: N images of C x H x W uint8 plus int64 labels, twice for a run that trains its
  clients on Ray (:func:`~rayfed.execution.stack_merger.training_backend`), as the object store
  holds a copy; and what the synthetic generator needs while it runs
  (:func:`rayfed.data.synthetic.check_synthetic`);
* **partition**: the int64 index arrays (every sample once) and the temporary arrays
  building, splitting and saving them need (:data:`PARTITION_BYTES_PER_SAMPLE` per
  sample, :data:`PARTITION_BYTES_PER_CLIENT` per client and
  :data:`PARTITION_BYTES_PER_CLIENT_CLASS` per client and class for the (M, K) label-count
  tables), what stays again in the object store with ``engine.backend=ray``;
* **server state**: the global model and its aggregation buffer, plus K class-wise heads
  and two (M, K) tables for ``cwfedavg`` (docs/algorithms.md, cwFedAvg section) or one
  weight per client and block for ``fedawa`` / ``fedawa_l`` (docs/algorithms.md, FedAWA
  section);
* **client state store**: for algorithms that keep client state, what one client keeps
  (``StateSizes.client_state_bytes``: one model by default, its BatchNorm buffers for cwFedAvg, its
  head for FedPer, a momentum buffer for SGDM clients, every client's model for APPLE)
  times the clients, capped by ``engine.client_state_memory_mb`` (beyond it, states spill to
  disk; :func:`check_client_states` refuses a run whose states fit in neither);
* **round records**: :data:`DRIVER_BYTES_PER_CLIENT` per sampled client per round (its
  place in a batch, its train and evaluation reports, its row of the clients table);
* **workers**: when Ray runs on this machine, each worker process
  (:data:`WORKER_PROCESS_BYTES`) with its model, gradients, optimizer state and a copy.

It is an estimate, not a bound: Python objects, allocator slack and a dataset loader's
own temporaries are not counted, and a dataset rayfed does not know the size of
(registered by a user) counts as 0. :func:`check_memory` compares it with the memory the
machine has available and refuses a run that cannot fit, or warns about one that takes
more than half.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rayfed.algorithms import resolve
from rayfed.algorithms.sizing import model_state_bytes
from rayfed.config import RunConfig
from rayfed.data.registry import check_dataset_options, dataset_options
from rayfed.data.synthetic import check_synthetic
from rayfed.engine.problem_build import ShapeOnly, build_problem
from rayfed.execution.devices import check_local_gpu
from rayfed.execution.stack_merger import training_backend
from rayfed.models import InputShape
from rayfed.train.problem import ProblemSpec
from rayfed.util.errors import ResourceError
from rayfed.util.files import format_bytes

logger = logging.getLogger(__name__)

__all__ = [
    "MemoryEstimate",
    "MemoryPart",
    "estimate_memory",
    "available_memory",
    "check_memory",
    "check_fits",
    "check_client_states",
    "client_states_bytes",
    "free_disk",
]

PARTITION_BYTES_PER_SAMPLE = 64
"""int64 words per sample alive at the peak of building a partition (class order, owners,
grouping, shuffled split, label counting) or of saving it (client, split and index columns)."""
PARTITION_BYTES_PER_CLIENT_CLASS = 16
"""The two (M, K) int64 label-count tables."""
PARTITION_BYTES_PER_CLIENT = 200
"""Offsets, sizes and one small permutation array per client (the train/test split)."""
DRIVER_BYTES_PER_CLIENT = 1200
"""Per sampled client and round on the driver: batch lists, report objects and table rows."""
WORKER_PROCESS_BYTES = 300 * 2**20
"""A Ray worker process with PyTorch imported, before it holds a model."""
WARN_FRACTION = 0.5
"""Warn when the estimate exceeds this fraction of the available memory."""

_KNOWN_DATASETS: dict[str, tuple[int, int, tuple[int, int, int], int]] = {
    "mnist": (60_000, 10_000, (1, 28, 28), 10),
    "fashion_mnist": (60_000, 10_000, (1, 28, 28), 10),
    "cifar10": (50_000, 10_000, (3, 32, 32), 10),
    "cifar100": (50_000, 10_000, (3, 32, 32), 100),
    "tiny_imagenet": (100_000, 0, (3, 64, 64), 200),
    "emnist_letters": (124_800, 20_800, (1, 28, 28), 26),
}
"""(training samples, test samples, input shape, classes) of the built-in torchvision datasets."""


@dataclass(frozen=True)
class MemoryPart:
    """One counted part: its bytes and the config field that drives it (the one to lower)."""

    name: str
    bytes: int
    field: str


@dataclass(frozen=True)
class MemoryEstimate:
    """The parts of :func:`estimate_memory`, largest first."""

    parts: tuple[MemoryPart, ...]

    @property
    def total(self) -> int:
        return sum(part.bytes for part in self.parts)

    @property
    def largest(self) -> MemoryPart:
        return self.parts[0]

    def describe(self) -> str:
        """E.g. ``"dataset 7.9 GB (data.options.num_samples), partition 1.1 GB (data.num_clients), ..."``."""
        return ", ".join(f"{p.name} {format_bytes(p.bytes)} ({p.field})" for p in self.parts if p.bytes)


def _dataset_size(config: RunConfig) -> tuple[int, InputShape, int, int] | None:
    """(N, (C, H, W), K, the loader's working bytes) from the config alone; None for an unknown dataset.

    The options are checked as the loader checks them, so a bad option gets the loader's
    message, not a failed estimate.
    """
    data = config.data
    options = {**dataset_options(data.dataset), **check_dataset_options(data.dataset, data.options)}
    if data.dataset == "synthetic":
        args = [options[key] for key in ("num_samples", "num_classes", "channels", "image_size")]
        working = check_synthetic(*args)
        num_samples, num_classes, channels, size = args
        return num_samples, (channels, size, size), num_classes, working
    if data.dataset == "ag_news":  # (L, V) token sequences; V at most max_vocab, 4 classes
        tokens: InputShape = (options["max_len"], options["max_vocab"])
        return 120_000 + (7_600 if options["merge_splits"] else 0), tokens, 4, 0
    if data.dataset not in _KNOWN_DATASETS:
        return None
    train, test, shape, classes = _KNOWN_DATASETS[data.dataset]
    classes += 1 if options.get("na_class") else 0  # emnist_letters' 27-way head
    merged = options.get("merge_splits", True)  # the loaders merge train and test by default
    return train + (test if merged else 0), shape, classes, 0


def _dataset_shape(config: RunConfig) -> tuple[int, InputShape, int, int]:
    """:func:`_dataset_size`, with a 1×28×28, 10-class stand-in of no samples for a dataset rayfed does
    not know the size of."""
    return _dataset_size(config) or (0, (1, 28, 28), 10, 0)


def _problem(config: RunConfig, shape: InputShape, classes: int) -> ProblemSpec:
    """The run's :class:`ProblemSpec` from the config alone: the one problem builder on the ``meta``
    device, so nothing is allocated."""
    return build_problem(config, ShapeOnly(shape, classes), device="meta")[0]


def client_states_bytes(config: RunConfig, spec: ProblemSpec | None = None) -> tuple[int, int]:
    """(bytes one client keeps between rounds, bytes all clients keep) for ``config``'s algorithm
    (``StateSizes.client_state_bytes``); (0, 0) if its clients keep no state."""
    algorithm = resolve(config.algorithm)
    if not algorithm.keeps_client_state:
        return 0, 0
    if spec is None:
        _, shape, classes, _ = _dataset_shape(config)
        spec = _problem(config, shape, classes)
    per_client = algorithm.client_state_bytes(spec, config.train)
    return per_client, per_client * config.data.num_clients


def _local_workers(config: RunConfig) -> int:
    """Worker processes on this machine: 0 in-process, else the workers of a Ray started here."""
    engine = config.engine
    if training_backend(engine) == "local" or engine.ray_address or os.environ.get("RAY_ADDRESS"):
        return 0
    return engine.num_workers or engine.workers_for(max(1, int((os.cpu_count() or 1) // engine.num_cpus_per_worker)))


def estimate_memory(config: RunConfig) -> MemoryEstimate:
    """Estimate the memory ``config`` needs on this machine, without allocating it (see the module docstring)."""
    data, engine = config.data, config.engine
    copies = 1 if training_backend(engine) == "local" else 2  # driver + object store
    num_samples, shape, classes, working = _dataset_shape(config)
    m = data.num_clients
    dataset_field = "data.options.num_samples" if data.dataset == "synthetic" else "data.dataset"
    sample = 4 * shape[0] if len(shape) == 2 else shape[0] * shape[1] * shape[2]  # int32 ids or uint8 pixels
    dataset = copies * num_samples * (sample + 8) + working
    kept = 8 * num_samples + m * (16 + 2 * 8 * classes)  # what stays: indices, offsets, label counts
    per_client = m * (PARTITION_BYTES_PER_CLIENT + PARTITION_BYTES_PER_CLIENT_CLASS * classes)
    partition = PARTITION_BYTES_PER_SAMPLE * num_samples + per_client + (copies - 1) * kept
    spec = _problem(config, shape, classes)
    floats = max(layout.size for layout in spec.layouts.values())
    server = resolve(config.algorithm).server_state_bytes(spec)
    grows_with_clients = server > 2 * model_state_bytes(spec)
    states = min(int(engine.client_state_memory_mb * 2**20), client_states_bytes(config, spec)[1])
    records = int(m * engine.join_ratio) * DRIVER_BYTES_PER_CLIENT
    workers = _local_workers(config) * (WORKER_PROCESS_BYTES + 4 * 4 * floats)
    parts = [
        MemoryPart("dataset", dataset, dataset_field),
        MemoryPart("partition", partition, "data.num_clients" if 2 * per_client > partition else dataset_field),
        MemoryPart("server state", server, "data.num_clients" if grows_with_clients else "model.name"),
        MemoryPart("client state store", states, "engine.client_state_memory_mb"),
        MemoryPart("round records", records, "data.num_clients"),
        MemoryPart("worker processes", workers, "engine.num_workers"),
    ]
    return MemoryEstimate(tuple(sorted(parts, key=lambda p: -p.bytes)))


def available_memory() -> tuple[int, int]:
    """(available, total) bytes of this machine, within the container's cgroup limit if it has one.

    Reads ``MemAvailable`` and ``MemTotal`` from ``/proc/meminfo`` (Linux); elsewhere the
    physical memory counts as available.
    """
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        available, total = (int(info[key].split()[0]) * 1024 for key in ("MemAvailable", "MemTotal"))
    except (OSError, KeyError, ValueError):
        total = available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            total = min(total, int(limit))
            available = min(available, total - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(0, available), total


def check_memory(config: RunConfig) -> MemoryEstimate:
    """Refuse a config whose estimate exceeds the available memory; warn above :data:`WARN_FRACTION` of it.

    Raises
    ------
    ResourceError
        Naming the estimate, its parts, the machine's memory and the field of the largest part.
    """
    estimate = estimate_memory(config)
    available, total = available_memory()
    largest = estimate.largest
    summary = (
        f"this run needs about {format_bytes(estimate.total)} of memory ({estimate.describe()}), and this machine "
        f"has {format_bytes(available)} available of {format_bytes(total)}"
    )
    if estimate.total > available:
        raise ResourceError(
            f"{summary}; the largest part is the {largest.name}, set by {largest.field}: lower it "
            "(the estimate is described in rayfed.engine.sizing)"
        )
    if estimate.total > WARN_FRACTION * available:
        logger.warning("%s; the largest part is the %s, set by %s", summary, largest.name, largest.field)
    return estimate


def check_fits(config: RunConfig, run_dir: str | Path) -> MemoryEstimate:
    """Refuse a run whose workers, memory or client states cannot fit, before any data is made or file written.

    The workers are checked against the Ray cluster (:func:`rayfed.actors.cluster.check_resources`)
    or, in-process, the GPU against this machine; then the memory (:func:`check_memory`) and the
    clients' states (:func:`check_client_states`: APPLE's grow as clients squared).
    """
    engine = config.engine
    if training_backend(engine) == "ray":
        from rayfed.actors.cluster import check_resources  # imports Ray, which a local run does not need

        check_resources(engine)
    else:
        check_local_gpu(engine)
    estimate = check_memory(config)
    check_client_states(config, run_dir)
    return estimate


def free_disk(path: str | Path) -> int:
    """Free bytes on the disk that holds ``path`` (its nearest existing ancestor, if it does not exist yet)."""
    target = Path(path).absolute()
    while not target.exists() and target != target.parent:
        target = target.parent
    return shutil.disk_usage(target).free


def check_client_states(config: RunConfig, run_dir: str | Path) -> None:
    """Refuse, before anything is written, a run whose clients' states fit neither the client state
    store's memory (``engine.client_state_memory_mb``) nor, where it spills, the free disk of ``run_dir``.

    Raises
    ------
    ResourceError
        Naming the algorithm, the bytes per client and in all, the two limits and the fields to change.
    """
    per_client, total = client_states_bytes(config)
    memory = int(config.engine.client_state_memory_mb * 2**20)
    if total <= memory:
        return
    disk = free_disk(run_dir)
    if total <= memory + disk:
        return
    m = config.data.num_clients
    raise ResourceError(
        f"algorithm.name={config.algorithm.name!r} keeps {format_bytes(per_client)} of state per client, "
        f"{format_bytes(total)} for data.num_clients={m}, but engine.client_state_memory_mb="
        f"{config.engine.client_state_memory_mb:g} holds {format_bytes(memory)} in memory and the disk of the run "
        f"directory {str(run_dir)!r} has {format_bytes(disk)} free; lower data.num_clients, raise "
        "engine.client_state_memory_mb, or set run_dir on a disk with more room"
    )
