"""The trained clients of one worker call, settled together: their numbers read from the device once.

While a call trains, nothing waits for the device: each trained client's loss and update norm stay
there as 0-d tensors, and so does its contribution where the algorithm builds it on the device
(FedAvg's weighted sum). :meth:`Settlement.result` sums every client's contribution in client order
and brings the sum, the losses and the norms to the host in one transfer. An update is accepted
when its norm is finite and within ``engine.max_update_norm`` and its contribution is finite; a sum
is finite only when every part is, so the parts are looked at, and the accepted ones summed again,
only in a call where something was wrong.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rayfed.algorithms import Broadcast, Contribution, RoundContext, sum_contributions
from rayfed.execution.reports import ClientReport, TrainResult
from rayfed.train.host import to_host
from rayfed.train.job import ClientJob, ClientState, TrainStats

logger = logging.getLogger(__name__)

__all__ = ["Measures", "Settlement"]

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
class _Entry:
    """A trained client, or a stack of clients whose contributions were summed on the device."""

    client_ids: list[int]
    num_train: list[int]
    steps: list[int]
    contribution: Contribution
    parts: Callable[[], list[Contribution]]
    """Each client's own contribution, in order (a stack's are made again, only when one is rejected)."""
    states: list[ClientState | None]
    bytes_down: list[int]
    local_num_test: list[int]
    seconds: float


class Settlement:
    """Collects a call's trained clients (:meth:`add`, :meth:`add_stack`) and settles them (:meth:`result`)."""

    def __init__(self, ctx: RoundContext, max_update_norm: float | None) -> None:
        self.ctx = ctx
        self.bound = max_update_norm
        self.entries: list[_Entry] = []
        self.numbers: dict[str, list[Any]] = {"loss": [], "norm": [], "start_loss": [], "local_correct": []}
        """Per entry, in order: its clients' mean losses, update norms, starting losses and correct predictions
        after training (a number, a 0-d tensor per client, a list of numbers or a 1-D tensor per stack)."""

    def add(
        self,
        broadcast: Broadcast,
        job: ClientJob,
        start: torch.Tensor,
        stats: TrainStats,
        seconds: float,
        measures: Measures = Measures(),
    ) -> None:
        """Take a trained client: its contribution and update norm, computed on the device."""
        norm = torch.linalg.vector_norm(job.flat.vector.detach() - start)
        self._add_one(broadcast, job, stats.loss, norm, stats.steps, seconds, measures)

    def _add_one(self, broadcast: Broadcast, job: ClientJob, loss: Any, norm: torch.Tensor, steps: int,
                 seconds: float, measures: Measures) -> None:
        contribution = broadcast.contribute(job)
        self.entries.append(_Entry([job.client_id], [job.num_train], [steps], contribution, lambda: [contribution],
                                   [job.state], [broadcast.bytes_down(job)], [measures.local_num_test], seconds))
        for name, value in (("loss", loss), ("norm", norm), ("start_loss", measures.start_loss),
                            ("local_correct", measures.local_correct)):
            self.numbers[name].append(value)

    def add_stack(
        self,
        broadcast: Broadcast,
        jobs: list[ClientJob],
        starts: torch.Tensor,
        trained: torch.Tensor,
        losses: torch.Tensor,
        steps: list[int],
        seconds: float,
        measures: list[Measures],
    ) -> None:
        """Take the clients of a stack from their starting and trained states (C, S): one summed contribution
        when the broadcast makes one (``contribute_stacked``), else one entry per client."""
        size = jobs[0].flat.size
        norms = torch.linalg.vector_norm(trained[:, :size] - starts[:, :size], dim=1)
        losses = torch.where(torch.tensor([n > 0 for n in steps], device=losses.device), losses, math.nan)
        summed = broadcast.contribute_stacked(jobs, trained)
        if summed is None:
            for i, job in enumerate(jobs):
                job.flat.load_state(trained[i])
                self._add_one(broadcast, job, losses[i], norms[i], steps[i], seconds, measures[i])
            return

        def parts() -> list[Contribution]:
            out = []
            for i, job in enumerate(jobs):
                job.flat.load_state(trained[i])
                out.append(broadcast.contribute(job))
            return out

        self.entries.append(_Entry([job.client_id for job in jobs], [job.num_train for job in jobs], steps, summed,
                                   parts, [job.state for job in jobs], [broadcast.bytes_down(job) for job in jobs],
                                   [m.local_num_test for m in measures], seconds))
        self.numbers["loss"].append(losses)
        self.numbers["norm"].append(norms)
        self.numbers["start_loss"].append(_column([m.start_loss for m in measures]))
        self.numbers["local_correct"].append(_column([m.local_correct for m in measures]))

    def result(self) -> TrainResult:
        """Accept or reject every client, sum the accepted contributions in client order, report each client."""
        total = _sum_keeping_parts([entry.contribution for entry in self.entries])
        columns, arrays = _read(self.numbers, [] if total is None else total.device_tensors())
        contribution = None if total is None else total.with_host_arrays(arrays)
        rejections = [self._norm_rejection(norm) for norm in columns["norm"]]
        if contribution is not None and not contribution.is_finite() or any(rejections):
            parts = [part for entry in self.entries for part in entry.parts()]
            if contribution is not None and not contribution.is_finite():
                finite = _read({"finite": [part.is_finite() for part in parts]}, [])[0]["finite"]
                rejections = [why or ("" if ok else NON_FINITE) for why, ok in zip(rejections, finite)]
            accepted = sum_contributions(part for part, why in zip(parts, rejections) if not why)
            contribution = None if accepted is None else accepted.with_host_arrays(to_host(accepted.device_tensors()))
        result = TrainResult(contribution, [])
        clients = [(entry, k) for entry in self.entries for k in range(len(entry.client_ids))]
        for i, ((entry, k), why) in enumerate(zip(clients, rejections)):
            cid = entry.client_ids[k]
            if why:
                logger.warning("round %d: update of client %d rejected: %s", self.ctx.round, cid, why)
            elif entry.states[k] is not None:
                result.states[cid] = entry.states[k]  # type: ignore[assignment]
            result.reports.append(ClientReport(
                client_id=cid, num_train=entry.num_train[k], train_loss=columns["loss"][i], steps=entry.steps[k],
                update_norm=columns["norm"][i], bytes_up=entry.contribution.nbytes, bytes_down=entry.bytes_down[k],
                seconds=entry.seconds, rejected=why, train_loss_eval=columns["start_loss"][i],
                local_num_test=entry.local_num_test[k], local_correct=int(columns["local_correct"][i]),
            ))
        return result

    def _norm_rejection(self, norm: float) -> str:
        """Why an update of this norm is rejected (non-finite, or above ``engine.max_update_norm``); "" if not."""
        if not math.isfinite(norm):
            return NON_FINITE
        if self.bound is not None and norm > self.bound:
            return f"update norm {norm:.4g} exceeds engine.max_update_norm={self.bound:g}"
        return ""


def _column(values: list[Any]) -> Any:
    """A stack's values of one number: one 1-D tensor when all are on the device, else a list of floats."""
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.stack(values)
    return [float(v) for v in values]


def _sum_keeping_parts(parts: list[Contribution]) -> Contribution | None:
    """The sum of ``parts`` in order, leaving every part as it was (a call may have to sum them again)."""
    if not parts:
        return None
    total = parts[0] + parts[1] if len(parts) > 1 else parts[0]
    for part in parts[2:]:
        total += part
    return total


def _read(columns: dict[str, list[Any]], tensors: list[torch.Tensor]) -> tuple[dict[str, list[float]], list[Any]]:
    """Host values of ``columns`` and host copies of ``tensors``, all in one transfer. A column holds, per
    entry, a number, a list of numbers, or a tensor on the device (0-d: one client; 1-D: a stack's)."""
    on_device = {name: [v.reshape(-1) for v in values if isinstance(v, torch.Tensor)]
                 for name, values in columns.items()}
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
    return host, arrays[len(stacked):]
