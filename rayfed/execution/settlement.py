"""The trained clients of one worker call, settled together: checked, summed and read from the device once.

While a call trains, nothing waits for the device: each trained client's loss and update norm stay
there as 0-d tensors, and so do its upload and the state it keeps, as the client half makes them on the
device. The runner hands over what the clients send (:class:`Uploads`, one entry per client or per stack: a
stack's declared weighted state is one matrix product over its clients, any other upload its clients' sum in
client order); :meth:`Settlement.result` sums the entries in order (:func:`sum_in_order`) and brings the sum, the
losses, the norms and the clients' states to the host in one transfer. An update is accepted when its norm is
finite and within ``engine.max_update_norm`` and its contribution is finite; a sum is finite only when every part
is, so the parts are asked for, and the accepted ones summed again, only in a call where something was wrong.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rayfed.algorithms import Contribution
from rayfed.execution.reports import ClientReport, TrainResult
from rayfed.execution.round_facts import RoundFacts
from rayfed.train.host import to_host
from rayfed.train.job import ClientJob, ClientState

logger = logging.getLogger(__name__)

__all__ = ["Measures", "Uploads", "Settlement", "sum_in_order"]

NON_FINITE = "non-finite update (NaN or Inf)"


@dataclass(frozen=True)
class Measures:
    """What a worker measured of a client besides its training, each a number or a 0-d tensor on the device."""

    start_loss: Any = math.nan
    """The starting model's mean train loss (``engine.eval_train_loss``), else NaN."""
    local_num_test: int = 0
    """Test samples the trained model was evaluated on (``engine.eval_local``), else 0."""
    local_correct: Any = 0
    """The trained model's correct predictions on them."""


@dataclass
class Uploads:
    """Clients trained together and what they send: one contribution (a stack's summed on the device), and each
    client's numbers, each a number or a 0-d tensor per client, or a list or a 1-D tensor for all of them."""

    client_ids: list[int]
    num_train: list[int]
    steps: list[int]
    contribution: Contribution
    parts: Callable[[], list[Contribution]]
    """Each client's own contribution, in order (made only when one is rejected)."""
    states: list[ClientState | None]
    bytes_up: list[int]
    bytes_down: list[int]
    seconds: float
    loss: Any
    norm: Any
    measures: list[Measures]
    trained_steps: list[int]
    """Each client's steps over all its phases, reported or not (``ClientJob.trained_steps``)."""

    @classmethod
    def of_one(
        cls,
        job: ClientJob,
        contribution: Contribution,
        loss: Any,
        norm: Any,
        steps: int,
        bytes_down: int,
        seconds: float,
        measures: Measures,
    ) -> Uploads:
        """One client's upload."""
        return cls(
            [job.client_id],
            [job.num_train],
            [steps],
            contribution,
            lambda: [contribution],
            [job.state],
            [contribution.nbytes],
            [bytes_down],
            seconds,
            loss,
            norm,
            [measures],
            [job.trained_steps],
        )


class Settlement:
    """Collects a call's uploads (:meth:`add`) and settles them (:meth:`result`): checks, sums, reads back."""

    def __init__(self, ctx: RoundFacts, max_update_norm: float | None) -> None:
        self.ctx = ctx
        self.bound = max_update_norm
        self.entries: list[Uploads] = []

    def add(self, uploads: Uploads) -> None:
        """Take clients trained together and what they send."""
        self.entries.append(uploads)

    def _numbers(self) -> dict[str, list[Any]]:
        """Per entry, in order: its clients' mean losses, update norms, starting losses and correct predictions."""
        return {
            "loss": [e.loss for e in self.entries],
            "norm": [e.norm for e in self.entries],
            "start_loss": [_column([m.start_loss for m in e.measures]) for e in self.entries],
            "local_correct": [_column([m.local_correct for m in e.measures]) for e in self.entries],
        }

    def result(self) -> TrainResult:
        """Accept or reject every client, sum the accepted contributions in client order, report each client."""
        total = sum_in_order([entry.contribution for entry in self.entries])
        summed = [] if total is None else total.device_tensors()
        kept = [(state, key) for e in self.entries for state in e.states if state for key in _on_device(state)]
        columns, arrays = _read(self._numbers(), [*summed, *(state[key] for state, key in kept)])
        for (state, key), array in zip(kept, arrays[len(summed) :]):
            state[key] = array
        contribution = None if total is None else total.with_host_arrays(arrays[: len(summed)])
        rejections = [self._norm_rejection(norm) for norm in columns["norm"]]
        if contribution is not None and not contribution.is_finite() or any(rejections):
            parts = [part for entry in self.entries for part in entry.parts()]
            if contribution is not None and not contribution.is_finite():
                finite = _read({"finite": [part.is_finite() for part in parts]}, [])[0]["finite"]
                rejections = [why or ("" if ok else NON_FINITE) for why, ok in zip(rejections, finite)]
            accepted = sum_in_order([part for part, why in zip(parts, rejections) if not why])
            contribution = None if accepted is None else accepted.with_host_arrays(to_host(accepted.device_tensors()))
        result = TrainResult(contribution, [])
        clients = [(entry, k) for entry in self.entries for k in range(len(entry.client_ids))]
        for i, ((entry, k), why) in enumerate(zip(clients, rejections)):
            cid = entry.client_ids[k]
            if why:
                logger.warning("round %d: update of client %d rejected: %s", self.ctx.round, cid, why)
            elif entry.states[k] is not None:
                result.states[cid] = entry.states[k]  # type: ignore[assignment]
            result.reports.append(
                ClientReport(
                    client_id=cid,
                    num_train=entry.num_train[k],
                    steps=entry.steps[k],
                    trained_steps=entry.trained_steps[k],
                    train_loss=columns["loss"][i] if entry.steps[k] else math.nan,
                    update_norm=columns["norm"][i],
                    bytes_up=entry.bytes_up[k],
                    bytes_down=entry.bytes_down[k],
                    seconds=entry.seconds,
                    rejected=why,
                    train_loss_eval=columns["start_loss"][i],
                    local_num_test=entry.measures[k].local_num_test,
                    local_correct=int(columns["local_correct"][i]),
                )
            )
        return result

    def _norm_rejection(self, norm: float) -> str:
        """Why an update of this norm is rejected (non-finite, or above ``engine.max_update_norm``); "" if not."""
        if not math.isfinite(norm):
            return NON_FINITE
        if self.bound is not None and norm > self.bound:
            return f"update norm {norm:.4g} exceeds engine.max_update_norm={self.bound:g}"
        return ""


def _on_device(state: ClientState) -> list[str]:
    """The keys of a client's state whose values are tensors (read back with the call's numbers)."""
    return [key for key, value in state.items() if isinstance(value, torch.Tensor)]


def _column(values: list[Any]) -> Any:
    """A stack's values of one number: one 1-D tensor when all are on the device, else a list of floats."""
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.stack(values)
    return [float(v) for v in values]


def sum_in_order(parts: Sequence[Contribution]) -> Contribution | None:
    """The sum of ``parts`` left to right, ``((p0 + p1) + p2) + ...``, leaving every part as it was (a call sums
    them again without a rejected client's); None for no parts. A stack's clients and a call's entries are summed
    by it alike."""
    if not parts:
        return None
    total = parts[0] + parts[1] if len(parts) > 1 else parts[0]
    for part in parts[2:]:
        total += part
    return total


def _read(columns: dict[str, list[Any]], tensors: list[torch.Tensor]) -> tuple[dict[str, list[float]], list[Any]]:
    """Host values of ``columns`` and host copies of ``tensors``, all in one transfer. A column holds, per
    entry, a number, a list of numbers, or a tensor on the device (0-d: one client; 1-D: a stack's)."""
    on_device = {
        name: [v.reshape(-1) for v in values if isinstance(v, torch.Tensor)] for name, values in columns.items()
    }
    stacked = [torch.cat(values).to(torch.float64) for values in on_device.values() if values]
    arrays = to_host([*stacked, *tensors])
    read = iter(arrays[: len(stacked)])
    host: dict[str, list[float]] = {}
    for name, values in columns.items():
        device_values = iter(next(read).tolist()) if on_device[name] else iter(())
        host[name] = []
        for value in values:
            if isinstance(value, torch.Tensor):
                host[name].extend(float(next(device_values)) for _ in range(value.numel()))
            else:
                host[name].extend(float(v) for v in (value if isinstance(value, list) else [value]))
    return host, arrays[len(stacked) :]
