"""Private runs end to end: ε in rounds.parquet and summary.json is dp-accounting's own, the noise is seeded
(local, Ray with two workers, a resumed run), no noise and no clipping is FedAvg to the bit, and what cannot be
protected or met is refused before anything is written."""

from __future__ import annotations

import json
import math
from typing import Any

import dp_accounting
import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import ConfigError, RunConfig, run
from rayfed.algorithms import resolve
from rayfed.engine.privacy_records import check_privacy
from rayfed.execution.privacy import ClientPrivacy
from rayfed.util.files import load_arrays
from tests.conftest import tiny_overrides
from tests.killed_driver import killed_and_resumed

CENTRAL = {"privacy.mechanism": "central", "privacy.clip_norm": 0.5, "privacy.noise_multiplier": 0.8}
COMPARED = ("accuracy", "acc_mean", "test_loss", "train_loss")
ADAPTIVE_PARTS = {"privacy.adaptive_quantile": 0.5, "privacy.count_noise": 1.0}
"""Adaptive clipping of two parts: their two counts need 2σ_b above z·√2 = 1.13 (docs/privacy.md)."""
CWFEDAVG = {**CENTRAL, "algorithm.name": "cwfedavg", "engine.join_ratio": 0.5}


def clipped_norms(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The norm of every clipped update the run's workers upload (before any local noise), as it runs."""
    norms: list[float] = []
    clipped = ClientPrivacy.clipped

    def recorded(self: ClientPrivacy, trained: Any, starts: Any, ids: Any, ctx: Any) -> Any:
        from rayfed.privacy.clipping import clipped_model

        norms.extend((clipped_model(trained, starts, self.clip_norm(ctx)) - starts).norm(dim=-1).tolist())
        return clipped(self, trained, starts, ids, ctx)

    monkeypatch.setattr(ClientPrivacy, "clipped", recorded)
    return norms


def test_the_epsilon_column_is_dp_accountings_own(tmp_path) -> None:
    config = RunConfig().override(tiny_overrides(tmp_path / "run", **CENTRAL, **{"engine.join_ratio": 0.5}))
    run(config)
    rounds = pq.read_table(tmp_path / "run" / "rounds.parquet").to_pylist()
    for row in rounds:
        t = row["round"] + 1
        accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        gaussian = dp_accounting.GaussianDpEvent(0.8 / 2)  # replace-one: the sum's sensitivity is 2C
        accountant.compose(dp_accounting.SampledWithoutReplacementDpEvent(10, 5, gaussian), t)
        assert row["epsilon"] == accountant.get_epsilon(1e-5)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["epsilon"] == rounds[-1]["epsilon"] and summary["delta"] == 1e-5


def test_no_noise_and_no_clipping_is_fedavg_bit_for_bit(tmp_path) -> None:
    common = {"data.partition": "dirichlet", "engine.join_ratio": 0.6}
    fedavg = run(RunConfig().override(tiny_overrides(tmp_path / "fedavg", **common)))
    private = {
        "privacy.mechanism": "central",
        "privacy.clip_norm": math.inf,
        "privacy.noise_multiplier": 0.0,
        "privacy.weighting": "samples",
    }
    same = run(RunConfig().override(tiny_overrides(tmp_path / "dp", **common, **private)))
    for key in COMPARED:
        assert [r[key] for r in same.history] == [r[key] for r in fedavg.history], key
    noised = run(RunConfig().override(tiny_overrides(tmp_path / "noised", **common, **CENTRAL)))
    assert [r["test_loss"] for r in noised.history] != [r["test_loss"] for r in fedavg.history]


def test_the_noise_is_the_same_on_ray_with_two_workers(tmp_path, ray_cluster) -> None:
    local = run(RunConfig().override(tiny_overrides(tmp_path / "local", **CENTRAL)))
    again = run(RunConfig().override(tiny_overrides(tmp_path / "again", **CENTRAL)))
    ray_engine = {"engine.backend": "ray", "engine.num_workers": 2}
    on_ray = run(RunConfig().override(tiny_overrides(tmp_path / "ray", **CENTRAL, **ray_engine)))
    for key in (*COMPARED, "epsilon"):
        assert [r[key] for r in again.history] == [r[key] for r in local.history], key
        assert [r[key] for r in on_ray.history] == [r[key] for r in local.history], key


@pytest.mark.parametrize(
    ("privacy", "columns"),
    [
        ({**CENTRAL, "privacy.mechanism": "local", "privacy.noise_multiplier": 0.05}, ("epsilon",)),
        ({**CENTRAL, "privacy.adaptive_quantile": 0.5, "privacy.clip_norm": 0.1}, ("epsilon", "clip_norm")),
    ],
    ids=["local", "adaptive"],
)
def test_a_resumed_private_run_draws_the_same_noise(tmp_path, privacy: dict, columns: tuple) -> None:
    full = run(RunConfig().override(tiny_overrides(tmp_path / "full", **privacy, **{"train.rounds": 4})))
    partial = RunConfig().override(tiny_overrides(tmp_path / "part", **privacy, **{"engine.checkpoint_every": 2}))
    run(partial)
    resumed = run(partial.override({"train.rounds": 4}), resume=True)
    for key in (*COMPARED, *columns):
        assert [r[key] for r in resumed.history] == [r[key] for r in full.history], key
    if "clip_norm" in columns:
        assert len({r["clip_norm"] for r in full.history}) > 1  # it adapted


@pytest.mark.parametrize(
    ("method", "names"),
    [
        ("fedawa", "client vectors"),
        ("ktpfl", "soft labels"),
        ("fedfomo", "is not declared a model"),
    ],
)
def test_a_method_whose_upload_cannot_be_protected_is_refused(method: str, names: str) -> None:
    config = RunConfig().override({"algorithm.name": method, **CENTRAL})
    with pytest.raises(ConfigError) as refused:
        check_privacy(config, resolve(config.algorithm))
    line = str(refused.value)
    assert f"algorithm.name={method!r}" in line and names in line and "\n" not in line


def test_a_target_epsilon_the_run_cannot_meet_is_refused() -> None:
    config = RunConfig().override({**CENTRAL, "privacy.target_epsilon": 1.0, "train.rounds": 50})
    with pytest.raises(ConfigError, match=r"privacy.target_epsilon=1 cannot be met: epsilon after train.rounds=50"):
        check_privacy(config, resolve(config.algorithm))
    met = config.override({"privacy.target_epsilon": 1e6})
    check_privacy(met, resolve(met.algorithm))


def test_secure_aggregation_without_a_clock_is_refused() -> None:
    config = RunConfig().override({**CENTRAL, "privacy.secure_aggregation": "secagg"})
    with pytest.raises(ConfigError, match="privacy.secure_aggregation='secagg' charges its messages on the virtual"):
        check_privacy(config, resolve(config.algorithm))


@pytest.mark.parametrize(
    "private",
    [{**CENTRAL, "privacy.adaptive_quantile": 0.5}, CWFEDAVG, {**CWFEDAVG, **ADAPTIVE_PARTS}],
    ids=["fedavg-adaptive", "cwfedavg-parts", "cwfedavg-parts-adaptive"],
)
def test_a_private_run_sigkilled_and_resumed_gives_the_same_bits(tmp_path, private: dict) -> None:
    # Prepare: the uninterrupted run, central DP (its noise, and with adaptive clipping its carried clip norm or
    # its parts' bounds)
    overrides = {**private, "train.rounds": 4, "engine.checkpoint_every": 1}
    reference = run(tiny_overrides(tmp_path / "ref", **overrides))
    run_dir = tmp_path / "killed"
    # Execute: the same run in a driver SIGKILLed once round 1 is checkpointed, then `rayfed run --resume`
    resumed = killed_and_resumed(run_dir, tiny_overrides(run_dir, **overrides))
    # Assert
    assert resumed.returncode == 0, resumed.stderr
    rows = pq.read_table(run_dir / "rounds.parquet").to_pylist()
    for key in (*COMPARED, "epsilon", *_adaptive_columns(reference.history, "adaptive_quantile" in str(private))):
        assert _plain([r[key] for r in rows]) == _plain([r[key] for r in reference.history]), key
    killed, ref = (load_arrays(sorted((d / "checkpoints").glob("*.npz"))[-1]) for d in (run_dir, tmp_path / "ref"))
    server = [name for name in ref if name.startswith("server/")]
    assert server and all(np.array_equal(killed[name], ref[name]) for name in server)


def _plain(values: list) -> list:
    """``values`` with NaN as None, so that equal records compare equal."""
    return [None if isinstance(v, float) and math.isnan(v) else v for v in values]


def _adaptive_columns(history: list[dict], adaptive: bool) -> list[str]:
    """The columns adaptive clipping records in ``history`` (a model's clip norm and noised fraction, or each part's),
    which must be there where the run adapts."""
    columns = [key for key in history[0] if key.startswith(("clip_norm", "server_unclipped_fraction"))]
    assert bool(columns) == adaptive, columns
    return columns


def test_a_shared_part_without_noise_or_clipping_is_the_method_bit_for_bit(tmp_path) -> None:
    # FedRep uploads its body alone (its heads never leave the clients): protected whole as a ModelUpload.
    common = {"algorithm.name": "fedrep", "engine.join_ratio": 0.6}
    plain = run(RunConfig().override(tiny_overrides(tmp_path / "plain", **common)))
    private = {
        "privacy.mechanism": "central",
        "privacy.clip_norm": math.inf,
        "privacy.noise_multiplier": 0.0,
        "privacy.weighting": "samples",
    }
    same = run(RunConfig().override(tiny_overrides(tmp_path / "dp", **common, **private)))
    for key in COMPARED:
        assert [r[key] for r in same.history] == [r[key] for r in plain.history], key


@pytest.mark.parametrize(
    ("method", "adaptive"),
    [("cwfedavg", {}), ("fedproto", {}), ("cwfedavg", ADAPTIVE_PARTS)],
    ids=["cwfedavg", "fedproto", "cwfedavg-adaptive"],
)
def test_a_method_with_parts_runs_private_part_by_part_with_the_runs_epsilon(
    tmp_path, ray_cluster, method: str, adaptive: dict
) -> None:
    # The parts (and with adaptive clipping their counts) share the run's noise multiplier: the method's ε is
    # FedAvg's at the same z (docs/privacy.md); the same bits on Ray with two workers (cwFedAvg's rows kept in its
    # clients' states there), the parts' adaptive bounds too.
    common = {**CENTRAL, "engine.join_ratio": 0.5, "algorithm.name": method, **adaptive}
    parts = run(RunConfig().override(tiny_overrides(tmp_path / "parts", **common)))
    ray_engine = {"engine.backend": "ray", "engine.num_workers": 2}
    again = run(RunConfig().override(tiny_overrides(tmp_path / "ray", **common, **ray_engine)))
    fedavg = run(RunConfig().override(tiny_overrides(tmp_path / "fedavg", **CENTRAL, **{"engine.join_ratio": 0.5})))
    assert [r["epsilon"] for r in parts.history] == [r["epsilon"] for r in fedavg.history]
    for key in (*COMPARED, *_adaptive_columns(parts.history, bool(adaptive))):
        assert _plain([r[key] for r in again.history]) == _plain([r[key] for r in parts.history]), key


@pytest.mark.parametrize("method", ["cwfedavg", "fedproto"])
def test_each_parts_adaptive_bound_follows_its_quantile_with_dp_accountings_epsilon(tmp_path, method: str) -> None:
    # Prepare: updates far beyond their first bound (C = 0.001), statistics within theirs (‖p̃_i‖₂ ≤ 1), γ = 0.5;
    # little noise, so that the direction of each step is the counts' (σ_b = 0.1 on m = 5: 2σ_b > z·√2).
    z, count_noise = 0.1, 0.1
    overrides = {
        **CENTRAL,
        "algorithm.name": method,
        "engine.join_ratio": 0.5,
        "train.rounds": 4,
        "privacy.clip_norm": 0.001,
        "privacy.noise_multiplier": z,
        "privacy.adaptive_quantile": 0.5,
        "privacy.count_noise": count_noise,
    }
    # Execute
    first = run(RunConfig().override(tiny_overrides(tmp_path / "first", **overrides)))
    second = run(RunConfig().override(tiny_overrides(tmp_path / "second", **overrides)))
    # Assert: the update's bound grows, the statistic's shrinks, below its own bound 1
    updates, statistics = ([r[f"clip_norm_{k}"] for r in first.history] for k in (1, 2))
    assert updates[0] == 0.001 and all(b > a for a, b in zip(updates, updates[1:])), updates
    assert statistics[0] == 1.0 and all(b < a for a, b in zip(statistics, statistics[1:])), statistics
    # ε: dp-accounting composing the round's 2P releases itself (replace-one: an update moves its part's sum by
    # 2B_k, noised z_k·B_k; a centred count moves by 1, noised σ_b), z_k = √P·(z⁻² − P(2σ_b)⁻²)^(−1/2)
    z_part = math.sqrt(2) * (z**-2 - 2 * (2 * count_noise) ** -2) ** -0.5
    releases = [dp_accounting.GaussianDpEvent(z_part / 2)] * 2 + [dp_accounting.GaussianDpEvent(count_noise)] * 2
    event = dp_accounting.SampledWithoutReplacementDpEvent(10, 5, dp_accounting.ComposedDpEvent(releases))
    for row in first.history:
        accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        accountant.compose(event, row["round"] + 1)
        assert row["epsilon"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    # the same bits twice
    for key in (*COMPARED, "epsilon", *_adaptive_columns(first.history, True)):
        assert _plain([r[key] for r in second.history]) == _plain([r[key] for r in first.history]), key


def _sampled_epsilon(rounds: int, num_clients: int, per_round: int, z: float) -> float:
    """dp-accounting's own ε at δ = 1e-5 after ``rounds`` rounds sampling ``per_round`` of ``num_clients`` without
    replacement (replace-one: the sum's sensitivity is 2C, the Gaussian's multiplier z/2)."""
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(num_clients, per_round, dp_accounting.GaussianDpEvent(z / 2))
    accountant.compose(event, rounds)
    return accountant.get_epsilon(1e-5)


def test_feddyn_runs_private_its_updates_clipped_and_its_epsilon_dp_accountings(tmp_path, monkeypatch) -> None:
    # Prepare: FedDyn (the baseline code's fidelity) with central DP, 5 of 10 clients a round
    norms = clipped_norms(monkeypatch)
    common = {**CENTRAL, "algorithm.name": "feddyn", "engine.join_ratio": 0.5}
    # Execute
    private = run(RunConfig().override(tiny_overrides(tmp_path / "dp", **common)))
    again = run(RunConfig().override(tiny_overrides(tmp_path / "again", **common)))
    # Assert: every upload within C (to float32 rounding), ε the sampled Gaussian's, the same bits twice
    assert len(norms) == 2 * 2 * 5 and max(norms) <= 0.5 * (1 + 1e-5)
    assert [r["epsilon"] for r in private.history] == [
        _sampled_epsilon(r["round"] + 1, 10, 5, 0.8) for r in private.history
    ]
    for key in (*COMPARED, "server_feddyn_h_norm"):
        assert [r[key] for r in again.history] == [r[key] for r in private.history], key


@pytest.mark.parametrize(("fidelity", "vectorize"), [("code", "off"), ("paper", "off"), ("paper", "on")])
def test_feddyn_without_noise_or_clipping_is_feddyn_bit_for_bit(tmp_path, fidelity: str, vectorize: str) -> None:
    # ``code`` weighs its clients by their samples, ``paper`` weighs them 1: privacy.weighting says the same; "on":
    # the clients of a call trained as one stack and clipped in one call
    common = {
        "algorithm.name": "feddyn",
        "algorithm.params": {"fidelity": fidelity},
        "engine.join_ratio": 0.6,
        "engine.vectorize": vectorize,
    }
    plain = run(RunConfig().override(tiny_overrides(tmp_path / "plain", **common)))
    private = {
        "privacy.mechanism": "central",
        "privacy.clip_norm": math.inf,
        "privacy.noise_multiplier": 0.0,
        "privacy.weighting": "samples" if fidelity == "code" else "uniform",
    }
    same = run(RunConfig().override(tiny_overrides(tmp_path / "dp", **common, **private)))
    for key in (*COMPARED, "server_feddyn_h_norm"):
        assert [r[key] for r in same.history] == [r[key] for r in plain.history], key


def test_feddyns_unweighted_paper_step_with_weighting_by_samples_is_refused() -> None:
    config = RunConfig().override(
        {
            **CENTRAL,
            "algorithm.name": "feddyn",
            "algorithm.params": {"fidelity": "paper"},
            "privacy.weighting": "samples",
        }
    )
    with pytest.raises(ConfigError) as refused:
        check_privacy(config, resolve(config.algorithm))
    line = str(refused.value)
    assert "algorithm.name='feddyn'" in line and "set privacy.weighting='uniform'" in line and "\n" not in line
