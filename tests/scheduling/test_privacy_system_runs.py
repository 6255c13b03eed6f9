"""Private runs with the systems model and with Poisson sampling: ε counts the round's planned sample, whoever of
it dropped, went offline or missed the deadline; secure aggregation's bytes reach the clock and the per-client
records; Poisson sampling's ε is dp-accounting's own (RDP and PLD) and its bits are the same on local and Ray."""

from __future__ import annotations

import json

import dp_accounting
import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfed import ConfigError, RunConfig, run
from rayfed.cli import main
from rayfed.engine.privacy_records import run_accounting
from rayfed.privacy.secure_aggregation import overhead_bytes
from tests.conftest import tiny_overrides

CENTRAL = {"privacy.mechanism": "central", "privacy.clip_norm": 0.5, "privacy.noise_multiplier": 0.8}
DEVICES = {"system.devices": "lognormal", "system.step_s": 0.01, "engine.join_ratio": 0.5, "train.rounds": 3}
LATE = {"system.deadline_s": 6.0, "system.dropout": 0.3}
REPLACE = dp_accounting.NeighboringRelation.REPLACE_ONE
ADD_OR_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def _rdp(event: dp_accounting.DpEvent, rounds: int, relation: dp_accounting.NeighboringRelation) -> float:
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    accountant.compose(event, rounds)
    return accountant.get_epsilon(1e-5)


def _rounds(run_dir) -> list[dict]:
    return [row for row in pq.read_table(run_dir / "rounds.parquet").to_pylist() if row["round"] >= 0]


def test_dropped_and_late_clients_count_toward_the_planned_sampling(tmp_path) -> None:
    run(RunConfig().override(tiny_overrides(tmp_path / "run", **CENTRAL, **DEVICES, **LATE)))
    rows = _rounds(tmp_path / "run")
    assert sum(row["clients_dropped"] + row["clients_late"] for row in rows) > 0  # some planned clients sent nothing
    gaussian = dp_accounting.GaussianDpEvent(0.8 / 2)  # replace-one: the sum moves by 2C
    for row in rows:  # 5 of 10 drawn each round, as planned, whoever reported
        expected = _rdp(dp_accounting.SampledWithoutReplacementDpEvent(10, 5, gaussian), row["round"] + 1, REPLACE)
        assert row["epsilon"] == expected
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["epsilon"] == rows[-1]["epsilon"]


def test_over_commitment_counts_every_client_drawn_and_diurnal_availability_claims_no_amplification(
    tmp_path,
) -> None:
    committed = {**CENTRAL, **DEVICES, "system.over_commit": 1.6, "train.rounds": 1}
    run(RunConfig().override(tiny_overrides(tmp_path / "over", **committed)))
    gaussian = dp_accounting.GaussianDpEvent(0.8 / 2)
    drawn = dp_accounting.SampledWithoutReplacementDpEvent(10, 8, gaussian)  # ⌊5 · 1.6⌋ drawn of 10
    assert _rounds(tmp_path / "over")[0]["epsilon"] == _rdp(drawn, 1, REPLACE)
    diurnal = {**CENTRAL, **DEVICES, "system.availability": "diurnal", "system.online_hours": 20.0}
    run(RunConfig().override(tiny_overrides(tmp_path / "diurnal", **{**diurnal, "train.rounds": 1})))
    assert _rounds(tmp_path / "diurnal")[0]["epsilon"] == _rdp(gaussian, 1, REPLACE)


def test_secure_aggregations_bytes_are_charged_on_the_clock(tmp_path) -> None:
    common = {**CENTRAL, **DEVICES, "train.rounds": 1}
    run(RunConfig().override(tiny_overrides(tmp_path / "plain", **common)))
    run(RunConfig().override(tiny_overrides(tmp_path / "secagg", **common, **{"privacy.secure_aggregation": "secagg"})))
    plain, secagg = (
        pq.read_table(tmp_path / d / "clients" / "round_000000.parquet").to_pandas() for d in ("plain", "secagg")
    )
    plain, secagg = (t[t["status"].notna()].sort_values("client_id") for t in (plain, secagg))
    upload = plain["charged_bytes_up"].to_numpy()
    assert np.array_equal(secagg["charged_bytes_up"].to_numpy(), upload + overhead_bytes("secagg", 5, upload))
    assert np.array_equal(secagg["bytes_up"].to_numpy(), plain["bytes_up"].to_numpy())  # what it sent: its model
    assert _rounds(tmp_path / "secagg")[0]["virtual_time_s"] > _rounds(tmp_path / "plain")[0]["virtual_time_s"]


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_poisson_samplings_epsilon_column_is_dp_accountings_own(tmp_path, accountant: str) -> None:
    poisson = {"engine.participation": "poisson", "engine.join_ratio": 0.3, "privacy.accountant": accountant}
    run(RunConfig().override(tiny_overrides(tmp_path / "run", **CENTRAL, **poisson)))
    event = dp_accounting.PoissonSampledDpEvent(0.3, dp_accounting.GaussianDpEvent(0.8))
    for row in _rounds(tmp_path / "run"):
        fresh = (
            dp_accounting.pld.PLDAccountant(ADD_OR_REMOVE)
            if accountant == "pld"
            else dp_accounting.rdp.RdpAccountant(neighboring_relation=ADD_OR_REMOVE)
        )
        fresh.compose(event, row["round"] + 1)
        assert row["epsilon"] == fresh.get_epsilon(1e-5)


def test_poisson_sampling_with_privacy_gives_the_same_bits_on_ray_with_two_workers(tmp_path, ray_cluster) -> None:
    poisson = {**CENTRAL, "engine.participation": "poisson", "engine.join_ratio": 0.2, "train.rounds": 4}
    local = run(RunConfig().override(tiny_overrides(tmp_path / "local", **poisson)))
    ray_engine = {"engine.backend": "ray", "engine.num_workers": 2}
    on_ray = run(RunConfig().override(tiny_overrides(tmp_path / "ray", **poisson, **ray_engine)))
    for key in ("accuracy", "test_loss", "epsilon"):
        assert [r[key] for r in on_ray.history] == [r[key] for r in local.history], key
    sampled = [
        len(pq.read_table(p).to_pandas().query("trained_steps > 0"))
        for p in sorted((tmp_path / "local" / "clients").glob("*.parquet"))
    ]
    assert len(set(sampled)) > 1  # the rounds took different numbers of clients


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"privacy.target_epsilon": 0.5, "train.rounds": 20}, "privacy.target_epsilon=0.5 cannot be met"),
        (
            {"algorithm.name": "fedbuff", "system.devices": "equal", "privacy.mechanism": "local"},
            "privacy.mechanism='local' counts one release per client per server step",
        ),
        ({"privacy.secure_aggregation": "secagg"}, "privacy.secure_aggregation='secagg' charges its messages"),
        ({"algorithm.name": "ktpfl"}, "cannot protect algorithm.name='ktpfl'"),
    ],
)
def test_a_private_run_that_cannot_hold_is_refused_before_anything_is_written(
    tmp_path, overrides: dict, says: str
) -> None:
    config = RunConfig().override(tiny_overrides(tmp_path / "run", **{**CENTRAL, **overrides}))
    with pytest.raises(ConfigError) as refused:
        run(config)
    assert says in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_rayfed_privacy_names_poisson_sampling_and_its_epsilon(capsys) -> None:
    args = ["engine.participation=poisson", "engine.join_ratio=0.1", "data.num_clients=100", "train.rounds=10"]
    assert main(["privacy", *args, "privacy.accountant=pld"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "each of 100 clients with probability 0.1 a round (Poisson)" in lines[0]
    accountant = dp_accounting.pld.PLDAccountant(ADD_OR_REMOVE)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)), 10)
    assert lines[1] == f"epsilon {accountant.get_epsilon(1e-5):.6g} with privacy.noise_multiplier=1"


def test_an_over_committed_round_that_draws_every_client_claims_no_amplification() -> None:
    # 5 of 10 kept, ⌊5 · 2⌋ = 10 drawn: one client added could take another's place, so replace-one, unamplified
    system = {"system.devices": "equal", "engine.join_ratio": 0.5, "data.num_clients": 10}
    every = run_accounting(RunConfig().override({**CENTRAL, **system, "system.over_commit": 2.0}))
    assert every is not None and every.epsilon(3) == _rdp(dp_accounting.GaussianDpEvent(0.8 / 2), 3, REPLACE)
    some = run_accounting(RunConfig().override({**CENTRAL, **system, "system.over_commit": 1.6}))
    drawn = dp_accounting.SampledWithoutReplacementDpEvent(10, 8, dp_accounting.GaussianDpEvent(0.8 / 2))
    assert some is not None and some.epsilon(3) == _rdp(drawn, 3, REPLACE)
