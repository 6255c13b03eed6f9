"""The data plane: datasets as uint8 arrays, client partitions as CSR index arrays or pool slices.

>>> from rayfed.data.settings import DataConfig
>>> from rayfed.data import load_dataset, make_partition
>>> ds = load_dataset("synthetic", None, options={"num_samples": 2000})
>>> part = make_partition(ds.labels, ds.num_classes, DataConfig(partition="dirichlet", num_clients=20, seed=1))
>>> part.num_clients, int(part.num_train().sum() + part.num_test().sum())
(20, 2000)

Importing this package registers every built-in dataset in :data:`DATASETS` and every
partitioner in :data:`PARTITIONERS`, and imports no torch: the batch transforms
(:mod:`~rayfed.data.transforms`, torch) are imported on first use, so the config, which holds
:class:`~rayfed.data.settings.DataConfig`, and the command line stay light.
"""

from rayfed.data import pfllib_folder as _pfllib_folder  # noqa: F401  (registers the pfllib dataset and partition)
from rayfed.data import text as _text  # noqa: F401  (registers ag_news)
from rayfed.data import torchvision_data as _torchvision_data  # noqa: F401  (registers loaders)
from rayfed.data.dataset import IMAGE, TOKENS, ArrayDataset
from rayfed.data.partition import (
    LABEL_COUNTS_FILE,
    ClientPartition,
    Partition,
    load_partition,
    read_label_counts,
    write_label_counts,
)
from rayfed.data.partitioners import (
    PARTITIONERS,
    Partitioner,
    make_partition,
    partition_dirichlet,
    partition_iid,
    partition_pathological,
)
from rayfed.data.pool_slices import PoolSlices
from rayfed.data.registry import DATASETS, DatasetLoader, dataset_options, load_dataset
from rayfed.data.split import split_train_test
from rayfed.data.synthetic import make_synthetic
from rayfed.data.text import VOCABULARY_FILE, save_vocabulary
from rayfed.util.lazy import lazy_exports

__all__ = [
    "DATASETS",
    "IMAGE",
    "LABEL_COUNTS_FILE",
    "PARTITIONERS",
    "ArrayDataset",
    "ClientPartition",
    "DatasetLoader",
    "Partition",
    "Partitioner",
    "PoolSlices",
    "TOKENS",
    "VOCABULARY_FILE",
    "dataset_options",
    "load_dataset",
    "load_partition",
    "make_partition",
    "make_synthetic",
    "model_inputs",
    "normalize_batch",
    "partition_dirichlet",
    "partition_iid",
    "partition_pathological",
    "read_label_counts",
    "save_vocabulary",
    "split_train_test",
    "write_label_counts",
]

_, __getattr__, __dir__ = lazy_exports(__name__, {"rayfed.data.transforms": ("model_inputs", "normalize_batch")})
