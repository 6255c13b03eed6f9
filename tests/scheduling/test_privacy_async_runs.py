"""Asynchronous aggregation with privacy end to end (docs/privacy.md, "Asynchronous aggregation"): FedBuff's and
FedAsync's rows clipped on the workers, each server step noised for the most one client adds to it, ε the
composition of the steps without amplification (dp-accounting's own, RDP and PLD), the same bits twice and after a
resume, no noise and no clipping the method to the bit, and what it cannot protect refused in one line."""

from __future__ import annotations

import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest

from rayfed import ConfigError, RunConfig, run
from rayfed.algorithms import resolve
from rayfed.cli import main
from rayfed.engine.privacy_records import check_privacy
from rayfed.execution.privacy import ServerPrivacy
from tests.conftest import tiny_overrides
from tests.engine.test_privacy_runs import COMPARED, clipped_norms

CENTRAL = {"privacy.mechanism": "central", "privacy.clip_norm": 0.5, "privacy.noise_multiplier": 0.8}
ASYNC = {
    "data.num_clients": 6,
    "data.partition": "iid",
    "train.rounds": 5,
    "system.devices": "lognormal",
}
PARAMS = {"fedbuff": {"concurrency": 3, "buffer_size": 2}, "fedasync": {"concurrency": 3}}


def _steps_epsilon(steps: int, z: float, accountant: str) -> float:
    """dp-accounting's own ε at δ = 1e-5 after ``steps`` server steps, each the Gaussian mechanism under replacing
    one client (sensitivity 2C: multiplier z/2), composed without amplification."""
    relation = dp_accounting.NeighboringRelation.REPLACE_ONE
    composed = (
        dp_accounting.pld.PLDAccountant(relation)
        if accountant == "pld"
        else dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    )
    composed.compose(dp_accounting.GaussianDpEvent(z / 2), steps)
    return composed.get_epsilon(1e-5)


def _config(run_dir: Path, method: str, **extra: object) -> RunConfig:
    return RunConfig().override(
        tiny_overrides(run_dir, **{**ASYNC, "algorithm.name": method, "algorithm.params": PARAMS[method], **extra})
    )


@pytest.mark.parametrize(("method", "accountant"), [("fedbuff", "rdp"), ("fedasync", "pld")])
def test_a_private_asynchronous_run_clips_every_update_and_composes_its_steps(
    tmp_path, monkeypatch, method: str, accountant: str
) -> None:
    # Prepare: central DP on drawn devices, 3 clients training at once
    norms = clipped_norms(monkeypatch)
    private = {**CENTRAL, "privacy.accountant": accountant}
    # Execute
    first = run(_config(tmp_path / "first", method, **private))
    again = run(_config(tmp_path / "again", method, **private))
    plain = run(_config(tmp_path / "plain", method))
    # Assert: every row within C (to float32 rounding); ε after step t is t steps' composition, in rounds.parquet
    # and summary.json; the noise seeded (the same bits twice) and there (not the run without privacy)
    assert norms and max(norms) <= 0.5 * (1 + 1e-5)
    steps = [r for r in first.history if r["round"] >= 0]
    assert [r["epsilon"] for r in steps] == [_steps_epsilon(r["round"] + 1, 0.8, accountant) for r in steps]
    for key in (*COMPARED, "epsilon", "virtual_time_s"):
        assert [r[key] for r in again.history] == [r[key] for r in first.history], key
    assert [r["test_loss"] for r in plain.history] != [r["test_loss"] for r in first.history]
    assert [r["virtual_time_s"] for r in plain.history] == [r["virtual_time_s"] for r in first.history]


@pytest.mark.parametrize(("method", "vectorize"), [("fedbuff", "off"), ("fedasync", "off"), ("fedbuff", "on")])
def test_no_noise_and_no_clipping_is_the_asynchronous_method_bit_for_bit(tmp_path, method: str, vectorize: str) -> None:
    # "on": the clients of a call trained as one stack, their rows clipped in one call
    stacked = {"engine.vectorize": vectorize}
    plain = run(_config(tmp_path / "plain", method, **stacked))
    private = {"privacy.mechanism": "central", "privacy.clip_norm": math.inf, "privacy.noise_multiplier": 0.0}
    same = run(_config(tmp_path / "dp", method, **private, **stacked))
    for key in (*COMPARED, "server_clients_aggregated"):
        assert [r[key] for r in same.history] == [r[key] for r in plain.history], key


def test_a_client_that_brings_two_updates_to_a_step_doubles_its_noise(tmp_path, monkeypatch) -> None:
    # Prepare: tests/scheduling/test_system_async's devices, on which client 0 arrives twice in FedBuff's first step
    # (K = 3, staleness 0 both times); the server's noise records each step's bound
    table = tmp_path / "devices.csv"
    rows = [f"{c},{s},1e12,1e12" for c, s in enumerate([1.82, 2.63, 4.56])]
    table.write_text("client_id,slowdown,download_mbps,upload_mbps\n" + "\n".join(rows) + "\n")
    bounds: list[tuple[int, float]] = []
    noise = ServerPrivacy.step_noise

    def recorded(self: ServerPrivacy, round_index: int, size: int, bound: float) -> np.ndarray | None:
        bounds.append((round_index, bound))
        return noise(self, round_index, size, bound)

    monkeypatch.setattr(ServerPrivacy, "step_noise", recorded)
    overrides = {
        **CENTRAL,
        "data.num_clients": 3,
        "data.partition": "iid",
        "train.rounds": 2,
        "system.devices": "trace",
        "system.device_trace": str(table),
        "system.step_s": 1 / 30,
        "algorithm.name": "fedbuff",
        "algorithm.params": {"concurrency": 3, "buffer_size": 3, "staleness": "constant"},
    }
    # Execute
    run(tiny_overrides(tmp_path / "run", **overrides))
    # Assert: step 0's heaviest client adds two updates (noise 2zC), and no step's bound is below one update
    assert bounds[0] == (0, 2.0) and all(bound >= 1.0 for _, bound in bounds)


def test_a_resumed_private_fedbuff_run_gives_the_same_bits(tmp_path) -> None:
    private = {**CENTRAL, "train.rounds": 5}
    full = run(_config(tmp_path / "full", "fedbuff", **private))
    partial = _config(tmp_path / "part", "fedbuff", **{**private, "train.rounds": 3, "engine.checkpoint_every": 1})
    run(partial)
    resumed = run(partial.override({"train.rounds": 5}), resume=True)
    for key in (*COMPARED, "epsilon"):
        assert [r[key] for r in resumed.history] == [r[key] for r in full.history], key


@pytest.mark.parametrize(
    ("method", "extra", "names"),
    [
        ("fedbuff", {"privacy.mechanism": "local"}, "algorithm.params.buffer_size=2 lets one client bring several"),
        ("fedbuff", {"privacy.weighting": "samples"}, "leave privacy.weighting='uniform'"),
        ("fedasync", {"privacy.adaptive_quantile": 0.5}, "leave privacy.adaptive_quantile out"),
        ("fedbuff", {"privacy.secure_aggregation": "secagg"}, "set privacy.secure_aggregation='off'"),
    ],
)
def test_what_an_asynchronous_step_cannot_protect_is_refused_in_one_line(method: str, extra: dict, names: str) -> None:
    config = _config(Path("unused"), method, **{**CENTRAL, **extra})
    with pytest.raises(ConfigError) as refused:
        check_privacy(config, resolve(config.algorithm))
    line = str(refused.value)
    assert f"algorithm.name={method!r}" in line and names in line and "\n" not in line


def test_fedasync_with_local_dp_runs_each_update_its_own_release(tmp_path) -> None:
    # K = 1: one release per client per step, so local DP's composition of the steps holds
    local = {**CENTRAL, "privacy.mechanism": "local", "privacy.noise_multiplier": 0.05}
    first = run(_config(tmp_path / "first", "fedasync", **local))
    again = run(_config(tmp_path / "again", "fedasync", **local))
    steps = [r for r in first.history if r["round"] >= 0]
    assert [r["epsilon"] for r in steps] == [_steps_epsilon(r["round"] + 1, 0.05, "rdp") for r in steps]
    assert [r["test_loss"] for r in again.history] == [r["test_loss"] for r in first.history]


def test_rayfed_privacy_counts_an_asynchronous_runs_server_steps(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["algorithm.name=fedbuff", "system.devices=equal", "data.num_clients=100", "train.rounds=10"]
    assert main(["privacy", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "100 clients, every one counted every server step" in lines[0] and "10 server steps" in lines[0]
    assert lines[1] == f"epsilon {_steps_epsilon(10, 1.0, 'rdp'):.6g} with privacy.noise_multiplier=1"
