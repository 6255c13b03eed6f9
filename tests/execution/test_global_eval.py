"""The global model evaluated beside the personalised ones (``ClientHalf.global_model``).

For cwFedAvg the global model is Eq. 7 of "Class-Wise Federated Averaging for Efficient
Personalization" (ICCV 2025) with the clients' overall class distribution p_j = Σ_i n_ij / Σ_ij n_ij;
FedAvg has no global model besides the one it evaluates, so its ``global_accuracy`` is NaN.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayfed import RunConfig, TrainConfig, run
from rayfed.algorithms import RoundContext
from rayfed.algorithms.cwfedavg_equations import empirical_distribution, personalise
from rayfed.data import load_dataset, make_partition
from rayfed.engine.metrics import summarise_round
from rayfed.engine.problem_build import build_problem
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.server import Server
from rayfed.train.evaluate import eval_batch_size, evaluate_model
from tests.conftest import tiny_overrides

NUM_CLIENTS = 10
CTX = RoundContext(round=0, seed=0, lr=TrainConfig().lr, sampled=np.arange(NUM_CLIENTS))
"""One round in which every client trains, at the default learning rate."""


def _trained(params: dict[str, object]) -> tuple[ClientRunner, Server]:
    """A runner and a cwFedAvg server after one round of every client on a small synthetic problem."""
    config = RunConfig().override(
        {
            "data.dataset": "synthetic",
            "data.options": {"num_samples": 1200},
            "data.num_clients": NUM_CLIENTS,
            "data.partition": "pathological",
            "data.classes_per_client": 2,
            "algorithm.name": "cwfedavg",
            "algorithm.params": params,
            "engine.backend": "local",
        }
    )
    dataset = load_dataset("synthetic", None, options=config.data.options)
    partition = make_partition(dataset.labels, dataset.num_classes, config.data)
    spec, initial = build_problem(config, dataset)
    runner, server = ClientRunner(config, spec, dataset, partition), Server(config, spec, initial)
    server.aggregate(CTX, runner.train(server.broadcast(), CTX, list(range(NUM_CLIENTS))).contribution)
    return runner, server


@pytest.mark.parametrize(
    "params",
    [
        {"wdr_lambda": 100},  # cwFedAvg (Output): the global head rides on the shared body's features
        {"classwise_blocks": 2},  # no shared body: the global model gets a forward of its own
    ],
)
def test_cwfedavg_global_accuracy_is_eq7_with_the_overall_distribution(params) -> None:
    runner, server = _trained(params)
    broadcast = server.broadcast()
    reports = runner.evaluate(broadcast, CTX, list(range(NUM_CLIENTS)))

    # The model by hand: head Σ_j p_j G_j with p the clients' overall class distribution, G_avg elsewhere.
    counts = runner.partition.label_counts.sum(axis=0)
    flat = runner.model_for(runner.spec.default_architecture)
    flat.load(personalise(empirical_distribution(counts), broadcast.heads), broadcast.parts.classwise)
    offset = 0
    for part in broadcast.parts.shared:
        flat.load(broadcast.shared[offset : offset + part.stop - part.start], part)
        offset += part.stop - part.start
    correct, loss = [], []
    for cid in range(NUM_CLIENTS):
        x, y = runner.gather(runner.partition.test(cid))
        stats = evaluate_model(flat.module, x, y)
        correct.append(stats.correct)
        loss.append(stats.loss_sum)

    assert [r.global_correct for r in reports] == correct
    np.testing.assert_allclose([r.global_loss_sum for r in reports], loss, rtol=1e-4)
    record = summarise_round(0, [], reports, {}, {})
    assert record.global_accuracy == pytest.approx(sum(correct) / sum(r.num_test for r in reports))


def test_global_accuracy_in_rounds_parquet(tmp_path) -> None:
    """cwFedAvg writes the global model's accuracy beside the personalised one; FedAvg, whose
    evaluated model is its global model, writes NaN (there is no second model to report)."""
    cw = run(RunConfig().override(tiny_overrides(tmp_path / "cw", **{"algorithm.name": "cwfedavg"})))
    fedavg = run(RunConfig().override(tiny_overrides(tmp_path / "fedavg", **{"algorithm.name": "fedavg"})))
    cw_rows = pq.read_table(cw.run_dir / "rounds.parquet").to_pylist()
    fedavg_rows = pq.read_table(fedavg.run_dir / "rounds.parquet").to_pylist()
    assert all(0.0 <= r["global_accuracy"] <= 1.0 for r in cw_rows)
    assert all(math.isnan(r["global_accuracy"]) for r in fedavg_rows)
    assert all(not math.isnan(r["accuracy"]) for r in fedavg_rows)
    assert all(math.isnan(r["local_accuracy"]) for r in fedavg_rows)  # measured only with engine.eval_local


def test_no_global_model_leaves_the_reports_empty() -> None:
    runner, server = _trained({})
    runner.client_half = _NoGlobal()  # type: ignore[assignment]
    fedavg_like = runner.evaluate(server.broadcast(), CTX, [0, 1])
    assert all(r.global_correct is None and r.global_loss_sum is None for r in fedavg_like)
    assert math.isnan(summarise_round(0, [], fedavg_like, {}, {}).global_accuracy)


class _NoGlobal:
    """A client half with neither a shared body nor a global model: each client evaluated with a zero model."""

    def global_model(self, message, job) -> None:  # noqa: ANN001
        return None

    def evaluation(self, message, job) -> torch.Tensor:  # noqa: ANN001
        return torch.zeros(job.flat.state_size)

    def fine_tuning(self, message, job) -> list:  # noqa: ANN001
        return []


def test_the_evaluation_batch_changes_no_prediction() -> None:
    """CPU forwards run 128 samples at a time (benchmarks/eval_batch.py: up to 1.7x faster than 1024);
    the batch must not change what is counted, only float rounding of the loss."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))
    x, y = torch.randn(300, 1, 8, 8), torch.randint(0, 3, (300,))
    assert eval_batch_size(torch.device("cpu")) == 128 and eval_batch_size(torch.device("cuda")) == 1024
    default, whole = evaluate_model(model, x, y), evaluate_model(model, x, y, batch_size=300)
    assert (default.correct, default.count) == (whole.correct, whole.count)
    assert default.loss_sum == pytest.approx(whole.loss_sum, rel=1e-6)


def test_local_accuracy_is_each_clients_model_right_after_its_local_training(tmp_path) -> None:
    # Prepare: local-only clients evaluate the very model they just trained; FedAvg's trained models are not the
    # global model it evaluates. Without engine.eval_local nothing is measured.
    small = {"engine.eval_local": True, "data.options": {"num_samples": 1000}, "train.rounds": 1}
    local = run(RunConfig().override(tiny_overrides(tmp_path / "local", **{"algorithm.name": "local", **small})))
    fedavg = run(RunConfig().override(tiny_overrides(tmp_path / "fedavg", **small)))
    # Assert
    assert [r["local_accuracy"] for r in local.history] == [r["accuracy"] for r in local.history]
    assert [r["local_acc_mean"] for r in local.history] == pytest.approx([r["acc_mean"] for r in local.history])
    assert all(0.0 < r["local_accuracy"] <= 1.0 and r["local_accuracy"] != r["accuracy"] for r in fedavg.history)
    clients = pq.read_table(tmp_path / "fedavg" / "clients").to_pylist()
    assert all(0.0 <= c["local_test_acc"] <= 1.0 for c in clients if c["sampled"])


def test_round_summary_takes_unweighted_means_of_the_clients() -> None:
    from rayfed.execution.reports import ClientReport, EvalReport

    # Prepare: two clients with 10 and 30 test samples.
    evals = [
        EvalReport(0, 10, 5, 20.0, global_correct=10, global_loss_sum=1.0),
        EvalReport(1, 30, 30, 3.0, global_correct=0, global_loss_sum=1.0),
    ]
    reports = [
        ClientReport(0, 50, 1.0, 5, 1.0, 0, 0, 0.0, local_num_test=10, local_correct=8),
        ClientReport(1, 50, 1.0, 5, 1.0, 0, 0, 0.0, local_num_test=30, local_correct=3),
    ]
    # Execute
    record = summarise_round(0, reports, evals, {}, {})
    # Assert: pooled over samples, and means over clients
    assert (record.accuracy, record.acc_mean) == (35 / 40, (0.5 + 1.0) / 2)
    assert (record.global_accuracy, record.global_acc_mean) == (10 / 40, (1.0 + 0.0) / 2)
    assert (record.local_accuracy, record.local_acc_mean) == (11 / 40, (0.8 + 0.1) / 2)
    assert (record.test_loss, record.test_loss_mean) == (23 / 40, (2.0 + 0.1) / 2)
