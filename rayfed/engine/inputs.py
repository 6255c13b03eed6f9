"""What a run trains on, made once before anything is written: data, problem, held-out set, partition.

:meth:`RunInputs.prepare` loads the dataset, builds every architecture (:func:`build_problem`),
lets the algorithm check itself against the problem, carves the held-out server data the
algorithm asks for (:mod:`rayfed.data.held_out`) and partitions the rest of the pool. When
the run continues in its directory, the partition and the held-out indices are read back
instead of drawn. :meth:`RunInputs.write` then records them in the run directory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from rayfed.algorithms import ResolvedAlgorithm
from rayfed.config import DataConfig, RunConfig
from rayfed.data import (
    DATASETS,
    LABEL_COUNTS_FILE,
    ArrayDataset,
    ClientPartition,
    load_dataset,
    load_partition,
    make_partition,
    save_vocabulary,
    write_label_counts,
)
from rayfed.data.held_out import (
    HELD_OUT_FILE,
    HeldOutRequest,
    HeldOutSet,
    choose_from_source,
    choose_held_out,
    load_held_out,
    partition_without,
    save_held_out,
)
from rayfed.engine.problem_build import build_problem
from rayfed.train.problem import ProblemSpec
from rayfed.util.errors import ConfigError
from rayfed.util.registry import closest

__all__ = ["RunInputs", "PARTITION_FILE"]

PARTITION_FILE = "partition.parquet"


@dataclass(frozen=True)
class RunInputs:
    """The dataset, the problem spec (with any held-out set), the initial parameters and the partition."""

    dataset: ArrayDataset
    spec: ProblemSpec
    initial: dict[str, np.ndarray]
    partition: ClientPartition

    @classmethod
    def prepare(cls, config: RunConfig, algorithm: ResolvedAlgorithm, run_dir: Path, *, continues: bool) -> RunInputs:
        """Make the inputs of ``config``'s run; ``continues``: read the partition and held-out indices
        that ``run_dir`` holds rather than drawing them. Raises ConfigError before anything is written."""
        data = config.data
        dataset = load_dataset(data.dataset, data.root, download=data.download, seed=data.seed, options=data.options)
        spec, initial = build_problem(config, dataset)
        algorithm.validate(spec)
        request = algorithm.held_out(spec)
        if request is not None:
            source = held_out_source(request, dataset, data)
            path = run_dir / HELD_OUT_FILE
            if continues and path.exists():
                indices = load_held_out(path, len(source), request.dataset)
            elif request.dataset:
                indices = choose_from_source(source.labels, source.num_classes, request, data.seed)
            else:
                indices = choose_held_out(dataset.labels, dataset.num_classes, request, data.seed)
            held_out = HeldOutSet.of(source, indices, shared=request.shared, source=request.dataset)
            spec = replace(spec, held_out=held_out)
        partition_path = run_dir / PARTITION_FILE
        if continues and partition_path.exists():
            partition = load_partition(partition_path, dataset.labels, dataset.num_classes)
        elif spec.held_out is not None and not spec.held_out.source:  # no client owns held-out server data
            partition = partition_without(dataset.labels, dataset.num_classes, data, spec.held_out.indices)
        else:
            partition = make_partition(dataset.labels, dataset.num_classes, data)
        return cls(dataset, replace(spec, train_sizes=partition.num_train()), initial, partition)

    def write(self, run_dir: Path) -> None:
        """Record what a resume and ``rayfed plot`` read: the partition, the held-out indices, each
        client's class counts and, for token datasets, the vocabulary (files already there are kept)."""
        if not (run_dir / PARTITION_FILE).exists():
            self.partition.save(run_dir / PARTITION_FILE)
        if self.spec.held_out is not None and not (run_dir / HELD_OUT_FILE).exists():
            save_held_out(run_dir / HELD_OUT_FILE, self.spec.held_out)
        if not (run_dir / LABEL_COUNTS_FILE).exists():  # p_i per client, for `rayfed plot`
            write_label_counts(run_dir / LABEL_COUNTS_FILE, self.partition, self.dataset.input_shape)
        save_vocabulary(run_dir, self.dataset)  # token datasets: vocabulary.txt, the meaning of every id


def held_out_source(request: HeldOutRequest, pool: ArrayDataset, data: DataConfig) -> ArrayDataset:
    """The dataset the held-out set is drawn from: the pool, or ``request.dataset`` loaded from
    ``data.root`` (its default options), which must give inputs of the pool's shape."""
    if not request.dataset:
        return pool
    known = DATASETS.names()
    if request.dataset not in known:
        raise ConfigError(
            f"{request.source_field}={request.dataset!r} is not a registered dataset{closest(request.dataset, known)}; "
            f"choose one of {', '.join(known)} or '' (the pool)"
        )
    if request.dataset == data.dataset:
        raise ConfigError(
            f"{request.source_field}={request.dataset!r} is the clients' own dataset (data.dataset); "
            "set it to '' to hold the samples out of the pool, so that no client owns them"
        )
    source = load_dataset(request.dataset, data.root, download=data.download, seed=data.seed)
    if source.input_shape != pool.input_shape or source.inputs.dtype != pool.inputs.dtype:
        raise ConfigError(
            f"{request.source_field}={request.dataset!r} gives inputs of shape {source.input_shape}, but the clients' "
            f"data.dataset={data.dataset!r} gives {pool.input_shape}; the clients' models read both, so choose a "
            "dataset of the same shape"
        )
    return source
