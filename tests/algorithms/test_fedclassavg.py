"""FedClassAvg: the loss terms on hand-computed cases, what leaves a client, state, and end-to-end runs."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayfed import ConfigError, RunConfig, run
from rayfed.algorithms import RoundContext
from rayfed.algorithms.fedclassavg import (
    CLASSIFIER_LAYER,
    FedClassAvgParams,
    FedClassAvgServer,
    classifier_prox,
    supcon_loss,
)
from rayfed.data import load_dataset, make_partition
from rayfed.engine import Simulation
from rayfed.engine.problem_build import build_problem
from rayfed.execution.client_runner import ClientRunner
from rayfed.execution.server import Server
from rayfed.models import build_model
from rayfed.models.fedclassavg_nets import FEDCLASSAVG_MODELS
from rayfed.train.flat import FlatModel
from rayfed.train.layout import ParamLayout
from rayfed.train.problem import ProblemSpec
from tests.algorithms.client_states import StateSnapshots
from tests.conftest import tiny_overrides

K = 10
CLASSIFIER_FLOATS = K * 512 + K


def _overrides(run_dir, **extra: object) -> dict[str, object]:
    """Tiny FedClassAvg runs: 400 synthetic 1x28x28 images over 4 clients, batch 16, no warm-up."""
    base = tiny_overrides(
        run_dir,
        **{
            "data.options": {"num_samples": 400},
            "data.num_clients": 4,
            "data.partition": "dirichlet",
            "data.alpha": 0.5,
            "model.client_models": list(FEDCLASSAVG_MODELS),
            "algorithm.name": "fedclassavg",
            "algorithm.params": {"warmup": False},
            "train.rounds": 1,
            "train.batch_size": 16,
            "train.lr": 5e-4,
            "engine.checkpoint_every": 0,
        },
    )
    base.update(extra)
    return base


# --- the math ---------------------------------------------------------------------------------


def _supcon_reference(features: np.ndarray, labels: np.ndarray, tau: float, tau_base: float) -> float:
    """The loss written anchor by anchor, straight from the definition."""
    views = np.concatenate([labels, labels])
    n = len(views)
    total = 0.0
    for a in range(n):
        others = [b for b in range(n) if b != a]
        log_denominator = math.log(sum(math.exp(features[a] @ features[b] / tau) for b in others))
        positives = [p for p in others if views[p] == views[a]]
        total += -np.mean([features[a] @ features[p] / tau - log_denominator for p in positives])
    return tau / tau_base * total / n


def test_supcon_loss_matches_hand_computed_cases() -> None:
    # Prepare: two orthogonal features; each sample's second view equals its first.
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    # Execute / Assert: different labels, τ = τ_base = 1. Each anchor has one positive
    # (its other view, s = 1) and contrasts {0, 1, 0}: ℓ = log(2 + e) − 1.
    assert float(supcon_loss(z, torch.tensor([0, 1]), 1.0, 1.0)) == pytest.approx(math.log(2 + math.e) - 1, rel=1e-6)
    # Same label: three positives with s = 0, 1, 0, so ℓ = log(2 + e) − 1/3.
    expected = math.log(2 + math.e) - 1 / 3
    assert float(supcon_loss(z, torch.tensor([3, 3]), 1.0, 1.0)) == pytest.approx(expected, rel=1e-6)
    # τ = 2, τ_base = 1: logits halve and the loss is scaled by 2.
    expected = 2 * (math.log(2 + math.exp(0.5)) - 0.5)
    assert float(supcon_loss(z, torch.tensor([0, 1]), 2.0, 1.0)) == pytest.approx(expected, rel=1e-6)


def test_supcon_loss_equals_the_anchor_by_anchor_definition() -> None:
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(12, 5, generator=generator, dtype=torch.float64) * 20  # unnormalised, as coded
    labels = torch.tensor([0, 1, 0, 2, 1, 0])
    expected = _supcon_reference(z.numpy(), labels.numpy(), 100.0, 0.07)
    assert float(supcon_loss(z, labels, 100.0, 0.07)) == pytest.approx(expected, rel=1e-9)


def test_classifier_prox_code_and_paper_forms() -> None:
    weight, bias = torch.ones(2, 3), torch.full((2,), 2.0)
    anchor_w, anchor_b = torch.zeros(2, 3), torch.zeros(2)
    # code: (ρ/2)(mean(1²) + mean(2²)) = 0.25 * 5; paper: ρ·sqrt(6·1 + 2·4) = 0.5·sqrt(14)
    assert float(classifier_prox(weight, bias, anchor_w, anchor_b, 0.5, "code")) == pytest.approx(1.25)
    assert float(classifier_prox(weight, bias, anchor_w, anchor_b, 0.5, "paper")) == pytest.approx(0.5 * math.sqrt(14))


def test_params_are_validated_with_the_field_named() -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.params\.rho must be a finite number >= 0"):
        FedClassAvgParams(rho=-1)
    with pytest.raises(ConfigError, match=r"algorithm\.params\.fidelity must be one of 'code', 'paper'"):
        FedClassAvgParams(fidelity="exact")
    with pytest.raises(ConfigError, match=r"algorithm\.params\.mode"):
        FedClassAvgParams(mode="features")
    with pytest.raises(ConfigError, match=r"algorithm\.params\.temperature"):
        FedClassAvgParams(temperature=0)
    with pytest.raises(ConfigError, match=r"algorithm\.params\.adam_betas"):
        FedClassAvgParams(adam_betas=(0.5,))
    with pytest.raises(ConfigError, match=r"algorithm\.params\.warmup"):
        FedClassAvgParams(mode="weight", warmup=True)
    assert FedClassAvgParams().warmup_enabled and not FedClassAvgParams(fidelity="paper").warmup_enabled
    assert FedClassAvgParams(adam_betas=["0.9", "0.99"]).adam_betas == (0.9, 0.99)


def test_models_without_the_shared_classifier_are_rejected(tmp_path) -> None:
    overrides = _overrides(tmp_path / "run", **{"model.client_models": [], "model.name": "cnn4"})
    with pytest.raises(ConfigError, match="output layer 'fc'"):
        run(RunConfig().override(overrides))
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_weight_mode_needs_one_architecture() -> None:
    names = (f"{CLASSIFIER_LAYER}.weight", f"{CLASSIFIER_LAYER}.bias")
    classifier = ParamLayout(names, ((K, 512), (K,)), (0, 5120, 5130))
    outputs = {"a": CLASSIFIER_LAYER, "b": CLASSIFIER_LAYER}
    layouts = {"a": classifier, "b": classifier}
    spec = ProblemSpec(4, K, (1, 28, 28), layouts, {}, outputs, client_architectures=("a", "b"))
    FedClassAvgServer(FedClassAvgParams(), spec, {})  # classifier mode: fine
    with pytest.raises(ConfigError, match=r"algorithm\.params\.mode='weight'.*one architecture"):
        FedClassAvgServer(FedClassAvgParams(mode="weight"), spec, {})


def test_token_inputs_are_refused_naming_the_dataset() -> None:
    names = (f"{CLASSIFIER_LAYER}.weight", f"{CLASSIFIER_LAYER}.bias")
    classifier = ParamLayout(names, ((K, 512), (K,)), (0, 5120, 5130))
    spec = ProblemSpec(4, K, (200, 1000), {"a": classifier}, {}, {"a": CLASSIFIER_LAYER}, input_kind="tokens")
    with pytest.raises(ConfigError, match=r"two augmented views.*'tokens' inputs"):
        FedClassAvgServer.validate(FedClassAvgParams(), spec)


# --- what travels, and what stays -------------------------------------------------------------


def _runner_and_server(config: RunConfig) -> tuple[ClientRunner, Server]:
    dataset = load_dataset(config.data.dataset, None, options=config.data.options)
    partition = make_partition(dataset.labels, dataset.num_classes, config.data)
    spec, initial = build_problem(config, dataset)
    return ClientRunner(config, spec, dataset, partition), Server(config, spec, initial)


def test_only_the_classifier_leaves_a_client(tmp_path) -> None:
    # Prepare: two ShuffleNet clients (the cheapest backbone).
    config = RunConfig().override(_overrides(tmp_path / "run", **{"model.client_models": ["fca_shufflenet"]}))
    runner, server = _runner_and_server(config)
    broadcast = server.broadcast()
    ctx = RoundContext(round=0, seed=0, lr=5e-4, sampled=np.array([0, 1]))
    # Execute
    result = runner.train(broadcast, ctx, [0, 1])
    # Assert: the upload is Σ n_k w_Ck over the two classifiers and nothing else: K·512 + K floats.
    contribution = result.contribution
    assert contribution.total.shape == (CLASSIFIER_FLOATS,) and contribution.nbytes == CLASSIFIER_FLOATS * 4 + 8
    flat = runner.model_for("fca_shufflenet")
    part = flat.slice_of(CLASSIFIER_LAYER)
    sizes = {r.client_id: r.num_train for r in result.reports}
    expected = sum(sizes[c] * result.states[c]["model"][part] for c in (0, 1))
    np.testing.assert_allclose(contribution.total, expected, rtol=1e-5, atol=1e-5)
    assert contribution.weight == sizes[0] + sizes[1]
    assert {(r.bytes_up, r.bytes_down) for r in result.reports} == {(CLASSIFIER_FLOATS * 4 + 8, CLASSIFIER_FLOATS * 4)}
    # ... while each client's whole model, with its trained classifier, stays in its state.
    assert result.states[0]["model"].shape == (flat.state_size,)
    # The server's new global classifier is the size-weighted average (Eq. 3).
    server.aggregate(ctx, contribution)
    np.testing.assert_allclose(server.broadcast().vector, expected / (sizes[0] + sizes[1]), rtol=1e-5, atol=1e-6)


def test_clients_start_from_their_own_initialisation(tmp_path) -> None:
    # Prepare: two never-trained clients of one architecture.
    config = RunConfig().override(_overrides(tmp_path / "run", **{"model.client_models": ["fca_shufflenet"]}))
    runner, server = _runner_and_server(config)
    message, half = server.broadcast(), runner.client_half
    part = runner.model_for("fca_shufflenet").slice_of(CLASSIFIER_LAYER)

    def loaded(cid: int, hook: str) -> np.ndarray:
        ctx = RoundContext(round=0, seed=0, lr=5e-4, sampled=np.array([cid]))
        job = runner.job(cid, ctx, None, test=runner.gather(runner.partition.test(cid)))
        model = half.start(message, job).model if hook == "start" else half.evaluation(message, job)
        job.flat.load_state(model)
        return job.flat.numpy()

    # Execute
    start0, start1, eval0 = loaded(0, "start"), loaded(1, "start"), loaded(0, "evaluation")
    # Assert: own extractors (reproducibly), the global classifier to train from, and the
    # client's own initial classifier when it is evaluated before it ever trained.
    assert not np.array_equal(start0[: part.start], start1[: part.start])
    np.testing.assert_array_equal(start0, loaded(0, "start"))
    np.testing.assert_array_equal(start0[part], message.vector)
    np.testing.assert_array_equal(eval0[: part.start], start0[: part.start])
    assert not np.array_equal(eval0[part], message.vector)


def _sampled(run_dir, round_index: int) -> set[int]:
    rows = pq.read_table(run_dir / "clients" / f"round_{round_index:06d}.parquet").to_pylist()
    return {r["client_id"] for r in rows if r["sampled"]}


def test_heterogeneous_backbones_persist_with_partial_participation(tmp_path) -> None:
    # Prepare: 8 clients over the four backbones, half of them sampled per round.
    config = RunConfig().override(
        _overrides(tmp_path / "run", **{"data.num_clients": 8, "train.rounds": 2, "engine.join_ratio": 0.5})
    )
    snapshots = StateSnapshots()
    # Execute
    sim = Simulation(config, callbacks=[snapshots])
    result = sim.run()
    # Assert: client c holds backbone c mod 4, each with its own state size.
    assert [sim.spec.architecture_of(c) for c in range(8)] == list(FEDCLASSAVG_MODELS) * 2
    sizes = {arch: sim.spec.layouts[arch].size for arch in FEDCLASSAVG_MODELS}
    assert len(set(sizes.values())) == 4
    rounds = pq.read_table(tmp_path / "run" / "rounds.parquet").to_pylist()
    assert [r["num_sampled"] for r in rounds] == [4, 4] and all(r["num_evaluated"] == 8 for r in rounds)
    assert all(np.isfinite(r["acc_mean"]) for r in rounds)
    first, second = snapshots.rounds
    sampled = [_sampled(tmp_path / "run", t) for t in (0, 1)]
    assert set(first) == sampled[0] and set(second) == sampled[0] | sampled[1]
    assert set(first) & sampled[1] and set(first) - sampled[1]  # both cases below occur
    for cid, state in second.items():
        arch = sim.spec.architecture_of(cid)
        extractor = slice(0, sim.spec.layouts[arch].slice_of(CLASSIFIER_LAYER).start)
        if cid in first and cid not in sampled[1]:  # kept as it was
            np.testing.assert_array_equal(state, first[cid])
        elif cid in first:  # trained again from its own backbone: the extractor moved on
            assert not np.array_equal(state[extractor], first[cid][extractor])
    assert result.rounds_run == 2


def test_all_four_backbones_end_to_end_and_bytes_per_client(tmp_path) -> None:
    # Prepare / Execute: a round with the code's warm-up, and FedAvg on the 4-layer CNN.
    fca = run(RunConfig().override(_overrides(tmp_path / "fca", **{"algorithm.params": {}})))
    fedavg = run(
        RunConfig().override(
            _overrides(
                tmp_path / "fedavg",
                **{"algorithm.name": "fedavg", "algorithm.params": {}, "model.client_models": [], "model.name": "cnn4"},
            )
        )
    )
    # Assert: FedClassAvg moves the classifier only, FedAvg the whole model (params + buffers).
    assert all(math.isfinite(r["acc_mean"]) and math.isfinite(r["train_loss"]) for r in fca.history)
    clients = pq.read_table(tmp_path / "fca" / "clients").to_pylist()
    assert {c["bytes_up"] for c in clients} == {CLASSIFIER_FLOATS * 4 + 8}
    assert {c["bytes_down"] for c in clients} == {CLASSIFIER_FLOATS * 4}
    cnn4 = FlatModel(build_model("cnn4", (1, 28, 28), K))
    clients = pq.read_table(tmp_path / "fedavg" / "clients").to_pylist()
    assert {c["bytes_up"] for c in clients} == {cnn4.state_size * 4 + 8}
    assert {c["bytes_down"] for c in clients} == {cnn4.state_size * 4}
    assert fedavg.rounds_run == 1


def test_weight_mode_averages_the_whole_homogeneous_model(tmp_path) -> None:
    overrides = _overrides(
        tmp_path / "run", **{"model.client_models": ["fca_shufflenet"], "algorithm.params": {"mode": "weight"}}
    )
    result = run(RunConfig().override(overrides))
    state_size = FlatModel(build_model("fca_shufflenet", (1, 28, 28), K)).state_size
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    assert {c["bytes_up"] for c in clients} == {state_size * 4 + 8}
    assert math.isfinite(result.final_accuracy)


def test_dropout_backbones_train_the_same_in_every_run(tmp_path) -> None:
    """fca_alexnet has dropout, which draws from torch's global generator: it is seeded per client,
    so two runs of one config give the same numbers (they did not before the seeding)."""
    overrides = {"model.client_models": ["fca_alexnet"], "data.num_clients": 2, "data.options": {"num_samples": 200}}
    results = [run(RunConfig().override(_overrides(tmp_path / f"r{i}", **overrides))) for i in range(2)]
    first, second = ([(r["accuracy"], r["train_loss"]) for r in result.history] for result in results)
    assert first == second
    assert not math.isnan(first[0][1])
