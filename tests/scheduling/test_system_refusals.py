"""The system model's bad input, each refused in one line naming the field or file (the client and column of a
table) and the fix, before anything is written; and a run in which no client's work ever reaches the server says
so, not that the losses were NaN."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfed import run
from rayfed.util.errors import ConfigError
from tests.conftest import tiny_overrides

LOGNORMAL = {"system.devices": "lognormal", "system.step_s": 0.05}
FEDBUFF = {"algorithm.name": "fedbuff", "algorithm.params": {"concurrency": 4, "buffer_size": 2}}
BRIEF = "{dir}/brief.csv"
"""Every client online 0.01 s of every 100 s: shorter than any round."""


def _devices(path: Path, cell: dict[int, str], column: int) -> None:
    rows = [["1", "10", "5"] for _ in range(10)]
    for client, value in cell.items():
        rows[client][column] = value
    path.write_text(
        "client_id,slowdown,download_mbps,upload_mbps\n" + "".join(f"{i},{','.join(r)}\n" for i, r in enumerate(rows))
    )


def _trace(name: str) -> dict[str, object]:
    return {"system.devices": "trace", "system.device_trace": "{dir}/" + name}


CASES = {
    "over-commitment beyond float": (
        {**LOGNORMAL, "engine.join_ratio": 0.5, "system.over_commit": 1e308},
        ["system.over_commit=1e+308", "more than the run's 10", "at most 2"],
    ),
    "over-commitment below 1": ({**LOGNORMAL, "system.over_commit": 0.5}, ["system.over_commit", ">= 1"]),
    "a text file as a FedScale trace": (_trace("trace.txt"), ["trace.txt' is not a pickle", ".csv or .parquet"]),
    "a slowdown that is not a number": (_trace("fast.csv"), ["fast.csv", "client 3's slowdown is 'fast'", "number"]),
    "a start that is not a number": (
        {**LOGNORMAL, "system.availability": "trace", "system.availability_trace": "{dir}/abc.csv"},
        ["abc.csv", "client 2's start_s is 'abc'", "number"],
    ),
    "a step beyond the clock": ({**LOGNORMAL, "system.step_s": 1e308}, ["system.step_s=1e+308", "lower system.step_s"]),
    "a bandwidth of 1e-320": (_trace("tiny.csv"), ["client 4's", "download bandwidth", "tiny.csv", "raise"]),
    "a spread beyond float": (
        {**LOGNORMAL, "system.compute_spread": 1000.0},
        ["system.compute_spread=1000", "lower system.compute_spread"],
    ),
    "a negative speed": (_trace("negative.csv"), ["client 1's slowdown is -2.0", "> 0"]),
    "a zero speed": (_trace("zero.csv"), ["client 1's slowdown is 0.0", "> 0"]),
    "a NaN speed": (_trace("nan.csv"), ["client 1's slowdown is nan", "> 0"]),
    "an infinite bandwidth": (_trace("inf.csv"), ["client 1's upload_mbps is inf", "> 0"]),
    "a zero bandwidth": (_trace("nobandwidth.csv"), ["client 1's download_mbps is 0.0", "> 0"]),
    "a negative median bandwidth": ({**LOGNORMAL, "system.download_mbps": -1.0}, ["system.download_mbps", "> 0"]),
    "a NaN median bandwidth": ({**LOGNORMAL, "system.upload_mbps": float("nan")}, ["system.upload_mbps", "> 0"]),
    "an infinite step": ({**LOGNORMAL, "system.step_s": float("inf")}, ["system.step_s", "finite"]),
    "a deadline of 0": ({**LOGNORMAL, "system.deadline_s": 0.0}, ["system.deadline_s", "> 0"]),
    "a trace shorter than the clients": (_trace("eight.csv"), ["eight.csv", "client_id 8, 9"]),
    "no client ever online": (
        {**LOGNORMAL, "system.availability": "trace", "system.availability_trace": "{dir}/never.csv"},
        ["never.csv", "no client is ever online"],
    ),
    "a buffer of 0": (
        {**LOGNORMAL, **FEDBUFF, "algorithm.params": {"concurrency": 4, "buffer_size": 0}},
        ["algorithm.params.buffer_size", ">= 1"],
    ),
    "an asynchronous run that can never step": (
        {**LOGNORMAL, **FEDBUFF, "system.availability": "trace", "system.availability_trace": BRIEF},
        ["could never make a step", "brief.csv", "online at most 0.01 s", "longer online windows"],
    ),
    "an asynchronous run lent a work that changes by round": (
        {**LOGNORMAL, **FEDBUFF, "algorithm.client": "fedfomo"},
        ["algorithm.client='fedfomo'", "changes from round to round", "fedbuff", "whose rounds are alike"],
    ),
}


@pytest.mark.parametrize(("overrides", "fragments"), list(CASES.values()), ids=list(CASES))
def test_bad_system_input_is_refused_in_one_line_before_anything_is_written(tmp_path, overrides, fragments) -> None:
    # Prepare
    (tmp_path / "trace.txt").write_text("hello, a trace\n")
    for name, cell, column in (
        ("fast.csv", {3: "fast"}, 0),
        ("tiny.csv", {4: "1e-320"}, 1),
        ("negative.csv", {1: "-2"}, 0),
        ("zero.csv", {1: "0"}, 0),
        ("nan.csv", {1: "nan"}, 0),
        ("inf.csv", {1: "inf"}, 2),
        ("nobandwidth.csv", {1: "0"}, 1),
    ):
        _devices(tmp_path / name, cell, column)
    (tmp_path / "eight.csv").write_text(
        "client_id,slowdown,download_mbps,upload_mbps\n" + "".join(f"{i},1,10,5\n" for i in range(8))
    )
    windows = "client_id,start_s,end_s,period_s\n"
    (tmp_path / "abc.csv").write_text(windows + "".join(f"{i},{'abc' if i == 2 else 0},100,200\n" for i in range(10)))
    (tmp_path / "never.csv").write_text(windows + "".join(f"{i},5,5,100\n" for i in range(10)))
    (tmp_path / "brief.csv").write_text(windows + "".join(f"{i},0,0.01,100\n" for i in range(10)))
    resolved = {k: v.format(dir=tmp_path) if isinstance(v, str) else v for k, v in overrides.items()}
    # Execute
    with pytest.raises(ConfigError) as refused:
        run(tiny_overrides(tmp_path / "run", **resolved))
    # Assert
    message = str(refused.value)
    assert "\n" not in message and all(fragment in message for fragment in fragments), message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("overrides", "cause"),
    [
        pytest.param({"system.dropout": 0.999999}, "(20 dropped out)", id="every client drops out"),
        pytest.param(
            {"system.availability": "trace", "system.availability_trace": BRIEF},
            "(20 went offline before they finished)",
            id="every client goes offline",
        ),
    ],
)
def test_a_run_whose_every_client_is_lost_says_so(tmp_path, overrides, cause) -> None:
    (tmp_path / "brief.csv").write_text(
        "client_id,start_s,end_s,period_s\n" + "".join(f"{i},0,0.01,100\n" for i in range(10))
    )
    resolved = {k: v.format(dir=tmp_path) if isinstance(v, str) else v for k, v in overrides.items()}
    result = run(tiny_overrides(tmp_path / "run", **{**LOGNORMAL, **resolved}))
    assert not result.trained and result.unreported is not None
    assert result.unreported.startswith(f"no client's work reached the server in any of the 2 rounds {cause}")
