"""Per-round and per-client metrics, computed the way the papers' code reports them.

* ``accuracy``: Σ_i correct_i / Σ_i n_i^test over the evaluated clients, the pooled
  (test-sample weighted) accuracy that PFLlib and the cwFedAvg code report;
* ``global_accuracy``: the same pooled accuracy of the algorithm's global model on the same
  clients' test splits (``ClientHalf.global_model``; for cwFedAvg Eq. 7 with the clients'
  overall class distribution), beside the personalised ``accuracy`` to show what personalisation
  adds. NaN when the algorithm has no global model besides the evaluated one (FedAvg, FedProx:
  there ``accuracy`` is the global model's);
* ``acc_mean`` / ``acc_std``: the unweighted mean and standard deviation of the
  per-client accuracies (FedClassAvg reports these; PFLlib prints the std);
  ``global_acc_mean``: the same mean of the global model's per-client accuracies (NaN without one);
* ``local_accuracy`` / ``local_acc_mean`` (only with ``engine.eval_local``, else NaN): the pooled and
  the unweighted mean accuracy of the sampled clients' models right after their local training,
  before the server aggregates, each on its own test split: the third model a paper may report
  (docs/algorithms.md, "Data and evaluation", "Which model a row reports");
* ``test_loss`` / ``test_loss_mean``: the evaluation models' cross-entropy on the test splits, pooled
  (Σ_i loss_i / Σ_i n_i^test) and as the unweighted mean of the clients' mean losses (FedClassAvg's code
  picks its reported round by the latter);
* ``train_loss``: the mean local cross-entropy, weighted by training samples, over the
  clients that took a step and whose update was accepted. A client that took no step
  (fewer training samples than a batch with ``train.drop_last``) has no loss: NaN in its
  row of ``clients/round_*.parquet``, left out of the round's mean; a round in which no
  client stepped has a NaN ``train_loss`` and logs a warning saying why;
* ``train_loss_eval`` (only with ``engine.eval_train_loss``, else NaN): the cross-entropy of
  each sampled client's *starting* model for the round over its own train split, weighted by
  training samples, without regulariser terms: the "train loss" of the papers' logs, which
  belongs to the model of the previous row (the previous round's result).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from rayfed.execution.reports import ClientReport, EvalReport
from rayfed.util.bounded import INTEGER, NUMBER, read_parquet

logger = logging.getLogger(__name__)

__all__ = ["RoundRecord", "counted_round", "loss_problem", "summarise_round", "client_table", "read_rounds_file"]


@dataclass
class RoundRecord:
    """One row of ``rounds.parquet``. Accuracy fields are NaN in rounds without evaluation."""

    round: int
    accuracy: float
    global_accuracy: float
    acc_mean: float
    acc_std: float
    test_loss: float
    train_loss: float
    num_sampled: int
    num_rejected: int
    num_evaluated: int
    bytes_up: int
    bytes_down: int
    train_s: float
    aggregate_s: float
    evaluate_s: float
    round_s: float
    train_loss_eval: float = math.nan
    global_acc_mean: float = math.nan
    local_accuracy: float = math.nan
    local_acc_mean: float = math.nan
    test_loss_mean: float = math.nan
    extra: dict[str, float] = field(default_factory=dict)
    """The server half's metrics (columns ``server_*``)."""
    system: dict[str, float] = field(default_factory=dict)
    """With a system model: the round's virtual time and what became of its clients (columns as named,
    :mod:`rayfed.scheduling.system_records`); empty without one."""
    privacy: dict[str, float] = field(default_factory=dict)
    """With privacy on: ``epsilon`` after the round (:mod:`rayfed.engine.privacy_records`); empty without."""

    def loss_problem(self) -> str | None:
        """Why this training round has no finite ``train_loss`` (its models did not change), or None if it has one."""
        return loss_problem(self.round, self.train_loss, self.num_sampled, self.num_rejected)

    def as_row(self) -> dict[str, float]:
        row = asdict(self)
        row.update({f"server_{k}" if not k.startswith("server_") else k: v for k, v in row.pop("extra").items()})
        row.update(row.pop("system"))
        row.update(row.pop("privacy"))
        return row


def read_rounds_file(path: str | os.PathLike[str], columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of a ``rounds.parquet`` (:meth:`RoundRecord.as_row`; only ``columns``, if given), its columns
    checked first: ``round`` whole numbers, every other column numbers (:func:`rayfed.util.bounded.read_parquet`);
    ValueError saying what is wrong, for the reader to name the file and its fix."""
    return read_parquet(path, {"round": INTEGER, "*": NUMBER}, columns=columns).to_pylist()


def counted_round(round_index: int) -> int:
    """A ``rounds.parquet`` round (0-based; -1 the initial model) counted as the progress bar counts it, which is how
    the figures, the reports and the experiment trackers show it: 1 for the first round, 0 for the initial model."""
    return round_index + 1


def loss_problem(round_index: int, train_loss: float, num_sampled: int, num_rejected: int) -> str | None:
    """Why a training round (``round_index`` >= 0) has no finite training loss, or None if it has one:
    every update rejected (NaN or infinite, or beyond ``engine.max_update_norm``), or none finite."""
    if round_index < 0 or math.isfinite(train_loss):
        return None
    if num_rejected == num_sampled > 0:
        return f"all {num_sampled} client updates rejected"
    if num_rejected:
        return f"{num_rejected} of {num_sampled} client updates rejected"
    return "no finite training loss"


def summarise_round(
    round_index: int,
    reports: Sequence[ClientReport],
    evals: Sequence[EvalReport],
    timings: dict[str, float],
    extra: dict[str, float],
) -> RoundRecord:
    """Fold the round's client reports and evaluations into one :class:`RoundRecord`."""
    if reports and not any(r.trained_steps > 0 for r in reports):
        logger.warning(
            "round %d: none of the %d sampled clients took a local step in any phase (too few training samples for "
            "one mini-batch: see train.batch_size and train.drop_last), so nothing was trained and train_loss is NaN",
            round_index,
            len(reports),
        )
    accepted = [r for r in reports if not r.rejected and r.steps > 0]
    n_train = sum(r.num_train for r in accepted)
    train_loss = sum(r.train_loss * r.num_train for r in accepted) / n_train if n_train else math.nan
    evaluated = [e for e in evals if e.num_test > 0]
    accuracy, acc_mean = _pooled_and_mean([(e.correct, e.num_test) for e in evaluated])
    acc_std = float(np.std([e.correct / e.num_test for e in evaluated])) if evaluated else math.nan
    test_loss, test_loss_mean = _pooled_and_mean([(e.loss_sum, e.num_test) for e in evaluated])
    on_global = [e for e in evaluated if e.global_correct is not None]
    global_accuracy, global_acc_mean = _pooled_and_mean([(e.global_correct or 0, e.num_test) for e in on_global])
    local_accuracy, local_acc_mean = _pooled_and_mean(
        [(r.local_correct, r.local_num_test) for r in reports if r.local_num_test > 0]
    )
    return RoundRecord(
        round=round_index,
        accuracy=accuracy,
        global_accuracy=global_accuracy,
        acc_mean=acc_mean,
        acc_std=acc_std,
        test_loss=test_loss,
        train_loss=train_loss,
        num_sampled=len(reports),
        num_rejected=sum(1 for r in reports if r.rejected),
        num_evaluated=len(evaluated),
        bytes_up=sum(r.bytes_up for r in reports),
        bytes_down=sum(r.bytes_down for r in reports),
        train_s=timings.get("train", 0.0),
        aggregate_s=timings.get("aggregate", 0.0),
        evaluate_s=timings.get("evaluate", 0.0),
        round_s=timings.get("round", 0.0),
        train_loss_eval=_start_loss(reports),
        global_acc_mean=global_acc_mean,
        local_accuracy=local_accuracy,
        local_acc_mean=local_acc_mean,
        test_loss_mean=test_loss_mean,
        extra=extra,
    )


def _pooled_and_mean(results: Sequence[tuple[float, int]]) -> tuple[float, float]:
    """(Σ total / Σ count, the unweighted mean of total / count) over the clients' (total, count) pairs with
    count > 0, e.g. (correct predictions, test samples) or (summed test loss, test samples); NaN for none."""
    if not results:
        return math.nan, math.nan
    totals, counts = (np.array(column, dtype=np.float64) for column in zip(*results))
    return float(totals.sum() / counts.sum()), float((totals / counts).mean())


def _start_loss(reports: Sequence[ClientReport]) -> float:
    """Sample-weighted mean of the clients' ``train_loss_eval`` (NaN when none was measured)."""
    measured = [r for r in reports if not math.isnan(r.train_loss_eval) and r.num_train > 0]
    n_train = sum(r.num_train for r in measured)
    return sum(r.train_loss_eval * r.num_train for r in measured) / n_train if n_train else math.nan


def client_table(round_index: int, reports: Sequence[ClientReport], evals: Sequence[EvalReport]) -> pa.Table:
    """One row per client that trained or was evaluated this round (``clients/round_XXXXXX.parquet``)."""
    by_id: dict[int, dict[str, object]] = {}
    for r in reports:
        by_id[r.client_id] = {
            "sampled": True,
            "num_train": r.num_train,
            "train_loss": r.train_loss,
            "steps": r.steps,
            "trained_steps": r.trained_steps,
            "update_norm": r.update_norm,
            "rejected": r.rejected,
            "bytes_up": r.bytes_up,
            "bytes_down": r.bytes_down,
            "train_s": r.seconds,
            "train_loss_eval": r.train_loss_eval,
            "local_test_acc": r.local_correct / r.local_num_test if r.local_num_test else math.nan,
        }
    for e in evals:
        row = by_id.setdefault(e.client_id, {"sampled": False})
        row.update(
            num_test=e.num_test,
            test_acc=e.correct / e.num_test if e.num_test else math.nan,
            test_loss=e.loss_sum / e.num_test if e.num_test else math.nan,
        )
    ids = sorted(by_id)
    schema = pa.schema(
        [
            ("round", pa.int32()),
            ("client_id", pa.int32()),
            ("sampled", pa.bool_()),
            ("num_train", pa.int32()),
            ("train_loss", pa.float64()),
            ("steps", pa.int32()),
            ("trained_steps", pa.int32()),
            ("update_norm", pa.float64()),
            ("rejected", pa.string()),
            ("bytes_up", pa.int64()),
            ("bytes_down", pa.int64()),
            ("train_s", pa.float64()),
            ("num_test", pa.int32()),
            ("test_acc", pa.float64()),
            ("test_loss", pa.float64()),
            ("train_loss_eval", pa.float64()),
            ("local_test_acc", pa.float64()),
        ]
    )
    columns = {name: [by_id[i].get(name) for i in ids] for name in schema.names[3:]}
    columns["sampled"] = [bool(by_id[i].get("sampled")) for i in ids]
    return pa.table({"round": [round_index] * len(ids), "client_id": ids, **columns}, schema=schema)
