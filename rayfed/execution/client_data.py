"""A worker's view of the clients: their data on the worker's device, one model per architecture, their jobs.

The dataset reaches a worker once per run (zero-copy from Ray's object store). On a GPU it is
then copied to the device once, as stored (uint8 images, int32 token ids), when it takes at most
:data:`RESIDENT_FRACTION` of the device's free memory; a call then gathers its clients' samples
on the device and turns them into model inputs there. A call's training data is gathered once,
for all of its clients, and each client's job holds a view of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from rayfed.algorithms import RoundContext
from rayfed.config import RunConfig
from rayfed.data import ArrayDataset, ClientPartition, model_inputs
from rayfed.execution.devices import pick_device
from rayfed.execution.round_facts import RoundFacts
from rayfed.models import build_model
from rayfed.train.flat import FlatModel
from rayfed.train.host import read_only_tensor, to_device
from rayfed.train.job import EVALUATION_ROUND, ClientJob, ClientState
from rayfed.train.problem import ProblemSpec
from rayfed.util.seeding import client_seed

__all__ = ["ClientData", "RESIDENT_FRACTION"]

RESIDENT_FRACTION = 0.25
"""A dataset stays on a worker's GPU when it takes at most this share of the GPU's free memory (four
workers sharing a GPU at 0.25 each then fit); a larger one stays on the host and each call's samples
are copied over."""

Samples = tuple[torch.Tensor, torch.Tensor]
"""(model inputs, labels) of some samples, on the worker's device."""


class ClientData:
    """The clients' data, the worker's models and the jobs built from them."""

    def __init__(self, config: RunConfig, spec: ProblemSpec, dataset: ArrayDataset, partition: ClientPartition) -> None:
        torch.set_num_threads(config.engine.torch_threads)
        self.config = config
        self.spec = spec.for_clients()  # held-out server data reaches the workers only when shared
        self.dataset = dataset
        self.partition = partition
        self.device = pick_device(config.engine.num_gpus_per_worker)
        self._models: dict[str, FlatModel] = {}
        self.label_counts = partition.label_counts
        self.train_label_counts = partition.train_label_counts
        self._inputs, self._labels = _resident(dataset, self.device)
        self._no_samples = self.gather(np.zeros(0, dtype=np.int64))
        """The samples of a job without data of a split: none, with the inputs' dtype and shape."""

    def model_for(self, architecture: str) -> FlatModel:
        """This worker's model of ``architecture``, built on first use (its values are always overwritten)."""
        if architecture not in self._models:
            module = build_model(architecture, self.dataset.input_shape, self.dataset.num_classes).to(self.device)
            self._models[architecture] = FlatModel(module)
        return self._models[architecture]

    def gather(self, indices: np.ndarray) -> Samples:
        """The model inputs and labels of dataset rows ``indices``, on the device."""
        rows = read_only_tensor(np.asarray(indices, dtype=np.int64))
        if self._inputs.device == self.device:
            rows = to_device([rows], self.device)[0]
            x, y = self._inputs.index_select(0, rows), self._labels.index_select(0, rows)
        else:  # uint8 images (int32 token ids) cross to the device before they become floats: a 4x smaller copy
            x, y = to_device([self._inputs.index_select(0, rows), self._labels.index_select(0, rows)], self.device)
        return model_inputs(x, self.dataset.mean, self.dataset.std), y

    def train_samples(self, client_ids: Sequence[int]) -> list[Samples]:
        """Each client's training split, gathered for all of them at once (each a view of one tensor)."""
        splits = [self.partition.train(cid) for cid in client_ids]
        x, y = self.gather(np.concatenate(splits) if splits else np.zeros(0, dtype=np.int64))
        sizes = [len(split) for split in splits]
        return list(zip(x.split(sizes), y.split(sizes)))

    def job(
        self,
        cid: int,
        ctx: RoundContext,
        state: ClientState | None,
        *,
        train: Samples | None = None,
        test: Samples | None = None,
        evaluation: bool = False,
    ) -> ClientJob:
        """Client ``cid``'s job in the round ``ctx``, holding the ``train`` and ``test`` samples given (none by
        default); an ``evaluation`` job draws its batches from the round :data:`EVALUATION_ROUND`."""
        round_index = EVALUATION_ROUND if evaluation else ctx.round
        architecture = self.spec.architecture_of(cid)
        x_train, y_train = train if train is not None else self._no_samples
        x_test, y_test = test if test is not None else self._no_samples
        return ClientJob(
            client_id=cid,
            round=round_index,
            worker_model=self.model_for(architecture),
            architecture=architecture,
            x_train=x_train,
            y_train=y_train,
            x_test=x_test,
            y_test=y_test,
            label_counts=self.label_counts[cid],
            train_label_counts=self.train_label_counts[cid],
            train=self.config.train,
            lr=ctx.lr,
            generator=torch.Generator().manual_seed(client_seed(ctx.seed, round_index, cid)),
            step_budget=None if evaluation else RoundFacts.of(ctx).budget_of(cid),
            state=state,
        )

    def pooled_test(self, client_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(test sizes, inputs, labels, owner index) of the clients' test splits, concatenated."""
        splits = [self.partition.test(cid) for cid in client_ids]
        sizes = to_device([np.array([len(split) for split in splits], dtype=np.int64)], self.device)[0]
        x, y = self.gather(np.concatenate(splits))
        owner = torch.repeat_interleave(torch.arange(len(client_ids), device=self.device), sizes)
        return sizes, x, y, owner


def _resident(dataset: ArrayDataset, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The dataset's inputs and labels as tensors: on a GPU when they fit (:data:`RESIDENT_FRACTION`), else
    wrapping the host arrays without a copy."""
    inputs, labels = read_only_tensor(dataset.inputs), read_only_tensor(dataset.labels)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if inputs.nbytes + labels.nbytes <= RESIDENT_FRACTION * free:
            return inputs.to(device), labels.to(device)
    return inputs, labels
