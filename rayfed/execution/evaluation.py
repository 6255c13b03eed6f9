"""Evaluating a call's clients on their own test splits, and the global model on the same splits.

Clients whose evaluation models share everything but the output layer (a client half that declares
:class:`~rayfed.algorithms.declarations.SharedBodyEvaluation`)
are evaluated together: one forward of the shared body over all their test samples, then each
client's output layer as a batched matrix product. A global model with that same body costs one
more matrix product; any other global model one forward over all their test samples. Counts and
losses add up on the device and are read once per group of clients.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rayfed.algorithms import ClientHalf, RoundContext
from rayfed.algorithms.declarations import SharedBody, evaluation_reads_train, shared_body
from rayfed.execution.client_data import ClientData
from rayfed.execution.reports import EvalReport
from rayfed.train.evaluate import eval_batch_size, evaluate_model, features_before_output
from rayfed.train.flat import FlatModel
from rayfed.train.host import to_device, to_host
from rayfed.train.job import ClientJob, ClientState

__all__ = ["evaluate_clients"]


class _Tally:
    """Correct predictions and summed cross-entropy per client, added batch by batch on the device."""

    def __init__(self, num_clients: int, device: torch.device) -> None:
        self.correct = torch.zeros(num_clients, device=device)
        self.loss_sum = torch.zeros(num_clients, device=device)

    def add(self, logits: torch.Tensor, target: torch.Tensor, rows: torch.Tensor) -> None:
        self.correct.index_add_(0, rows, (logits.argmax(dim=1) == target).float())
        self.loss_sum.index_add_(0, rows, F.cross_entropy(logits, target, reduction="none"))

    def results(self, sizes: torch.Tensor) -> list[tuple[int, int, float]]:
        """(test samples, correct, summed loss) per client, read in one transfer."""
        counts, correct, loss_sum = to_host([sizes, self.correct, self.loss_sum])
        return [(int(n), int(c), float(loss)) for n, c, loss in zip(counts, correct, loss_sum)]


def evaluate_clients(
    data: ClientData,
    client: ClientHalf[Any, Any],
    message: Any,
    ctx: RoundContext,
    client_ids: list[int],
    states: dict[int, ClientState] | None,
    evaluation_model: Callable[[Any, ClientJob], None],
) -> list[EvalReport]:
    """Accuracy of each client's evaluation model (``evaluation_model(message, job)`` loads it: the client half's
    ``evaluation``, fine-tuned by its ``fine_tuning``) on its own test split, and of the global model
    (``client.global_model``), if the algorithm has one, on the same split.

    Clients whose evaluation models share everything but the output layer (its declared ``shared_body``) are
    evaluated together: one forward of the shared body over all their test samples, then each client's output
    layer as a batched matrix product. A global model with that same body costs one more matrix product; any
    other global model one forward over all their test samples.
    """
    states = states or {}
    by_architecture: dict[str, list[int]] = {}
    for cid in client_ids:
        by_architecture.setdefault(data.spec.architecture_of(cid), []).append(cid)
    reports: dict[int, EvalReport] = {}
    for ids in by_architecture.values():
        population = replace(
            data.job(ids[0], ctx, None, evaluation=True),
            client_id=-1,
            label_counts=data.label_counts.sum(axis=0),
            train_label_counts=data.train_label_counts.sum(axis=0),
        )
        global_model = client.global_model(message, population)
        global_state = None if global_model is None else _host_state(global_model)
        plan = shared_body(client, message, [data.job(cid, ctx, states.get(cid), evaluation=True) for cid in ids])
        if plan is not None and plan.weight is None:  # one model for every client: one pooled forward
            own = _evaluate_pooled(data, ids, plan.state)
            on_global = own if global_state is not None and np.array_equal(global_state, plan.state) else None
        elif plan is not None:
            own, on_global = _evaluate_shared(data, ids, plan, global_state)
        else:
            own = []
            for cid in ids:
                test = data.gather(data.partition.test(cid))
                job = data.job(cid, ctx, states.get(cid), test=test, evaluation=True)
                if evaluation_reads_train(client):  # FedBABU, IFCA
                    job.x_train, job.y_train = data.gather(data.partition.train(cid))
                evaluation_model(message, job)
                result = evaluate_model(job.model, job.x_test, job.y_test)
                own.append((result.count, result.correct, result.loss_sum))
            on_global = None
        if global_state is not None and on_global is None:
            on_global = _evaluate_pooled(data, ids, global_state)
        for i, (cid, (count, correct, loss_sum)) in enumerate(zip(ids, own)):
            g_correct, g_loss = (None, None) if on_global is None else on_global[i][1:]
            reports[cid] = EvalReport(cid, count, correct, loss_sum, g_correct, g_loss)
    return [reports[cid] for cid in client_ids]


def _host_state(state: Any) -> np.ndarray:
    """A model state as a float32 numpy array (a tensor's values read back)."""
    if isinstance(state, torch.Tensor):
        return to_host([state.float()])[0]
    return np.asarray(state, dtype=np.float32)


def _evaluate_shared(
    data: ClientData, client_ids: list[int], plan: SharedBody, global_state: np.ndarray | None
) -> tuple[list[tuple[int, int, float]], list[tuple[int, int, float]] | None]:
    """Evaluate clients that share the body of ``plan``: features once, heads batched. The global
    model rides along when its body is the plan's: (count, correct, loss) per client, on their own
    models and on the global model (None when it needs a forward of its own)."""
    architecture = data.spec.architecture_of(client_ids[0])
    flat = data.model_for(architecture)
    output = data.spec.output_layer[architecture]
    global_head = _global_head(flat, output, plan, global_state)
    flat.load_state(plan.state)
    sizes, x, y, owner = data.pooled_test(client_ids)
    assert plan.weight is not None and plan.bias is not None
    weight, bias = to_device([plan.weight, plan.bias], data.device)
    own, on_global = _Tally(len(client_ids), data.device), _Tally(len(client_ids), data.device)
    for start, features in features_before_output(flat.module, output, x):
        rows, target = owner[start : start + len(features)], y[start : start + len(features)]
        own.add(torch.bmm(weight[rows], features.unsqueeze(2)).squeeze(2) + bias[rows], target, rows)
        if global_head is not None:
            on_global.add(F.linear(features, *global_head), target, rows)
    return own.results(sizes), on_global.results(sizes) if global_head is not None else None


@torch.no_grad()
def _evaluate_pooled(data: ClientData, client_ids: list[int], state: np.ndarray) -> list[tuple[int, int, float]]:
    """(count, correct, loss) per client of one model (``state``) over all their test samples, in one forward."""
    flat = data.model_for(data.spec.architecture_of(client_ids[0]))
    flat.load_state(state)
    flat.module.eval()
    sizes, x, y, owner = data.pooled_test(client_ids)
    tally = _Tally(len(client_ids), data.device)
    batch = eval_batch_size(data.device)
    for start in range(0, len(y), batch):
        stop = start + batch
        tally.add(flat.module(x[start:stop]), y[start:stop], owner[start:stop])
    return tally.results(sizes)


def _global_head(
    flat: FlatModel, output: str, plan: SharedBody, global_state: np.ndarray | None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The global model's output layer (weight, bias), if its body is exactly ``plan``'s body."""
    if global_state is None:
        return None
    head = flat.slice_of(output)
    body = np.ones(len(global_state), dtype=bool)
    body[head] = False
    if not np.array_equal(global_state[body], plan.state[body]):
        return None
    flat.load_state(global_state)
    weight, bias = (flat.module.get_parameter(f"{output}.{name}") for name in ("weight", "bias"))
    return weight.detach().clone(), bias.detach().clone()
