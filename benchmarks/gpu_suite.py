"""The GPU half of rayfed in one command: its CUDA tests, ``benchmarks/gpu.py`` and the throughput limit, one line.

CI has no GPU, so the checks that need one run here whenever a device is lent (``../shared/notes/gpu.md`` says how
to carry Ray there). Five steps, each with its own time limit and its whole output in ``--out``:

* ``tests``: the CUDA tests under pytest (parallel with pytest-xdist where it is installed): a training call
  reads the device back once under ``torch.cuda.set_sync_debug_mode("error")`` for every registered method,
  sequential and stacked, with and without CUDA graphs (``tests/execution/test_reads_back_once.py``); every
  method stacks on the device with the losses of training one client at a time
  (``tests/train/test_every_method_stacks.py`` with ``RAYFED_TEST_DEVICE=cuda``); CUDA-graph replay
  (``tests/train/test_graphs.py``), the stacked layers and the evaluation batches.
* ``gpu``: ``benchmarks/gpu.py`` (stacked over sequential, fractional GPUs, the papers' MNIST protocol beside a
  plain loop), shortened by ``--quick``.
* ``throughput``: ``benchmarks/throughput.py`` with two workers on the machine's CPUs (an idle box: the limit
  ratio against two plain processes).
* ``packing``: ``benchmarks/packing.py --gpu``: the lanes' occupancy, and a run packed into lanes against the same
  run unpacked, stacked on the device with CUDA graphs.
* ``packed_round``: ``benchmarks/packed_round.py``: a run-round of the papers' MNIST protocol alone and with 8
  seeds packed into one stack (``rayfed.run_many``), and P-ICCV Table 1's MNIST column at the papers' horizon in
  hours from each; shortened by ``--quick``.

    python benchmarks/gpu_suite.py --out DIR [--data-root DIR] [--steps tests,gpu,throughput,packing,packed_round]
        [--quick] [--limits 180,200,150,120,150]

The default limits add up to 800 s, within a lent device's 15 minutes. The last line: ``gpu_suite: device=<name>
torch=<version> tests=<passed>/<failed>/<errors> <gpu.py's figures> <throughput.py's figures> <packing.py's
figures> <packed_round.py's figures>``; the exit status is 1 when a test failed or a step did not finish. Without
CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CUDA_TESTS = (
    "tests/execution/test_reads_back_once.py",
    "tests/train/test_every_method_stacks.py",
    "tests/train/test_graphs.py",
    "tests/train/test_stacked.py",
    "tests/execution/test_global_eval.py",
)
STEPS = ("tests", "gpu", "throughput", "packing", "packed_round")


def _run(name: str, command: list[str], out: Path, limit_s: float, env: dict[str, str]) -> tuple[str, bool, float]:
    """Run ``command`` in its own process group, its output to ``out/<name>.log``; kill the group at ``limit_s``.
    Returns the output, whether it ended in time with status 0, and its seconds."""
    log = out / f"{name}.log"
    began = time.perf_counter()
    with log.open("w") as sink:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            ok = process.wait(timeout=limit_s) == 0
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            ok = False
            sink.write(f"\ngpu_suite: {name} stopped at its limit of {limit_s:.0f} s\n")
    seconds = time.perf_counter() - began
    text = log.read_text(errors="replace")
    print(f"gpu_suite: {name} {'ok' if ok else 'FAILED'} in {seconds:.0f} s ({log})", flush=True)
    return text, ok, seconds


def _pytest_counts(text: str) -> str:
    """``passed/failed/errors`` from pytest's last summary line."""
    counts = {kind: 0 for kind in ("passed", "failed", "error")}
    for number, kind in re.findall(r"(\d+) (passed|failed|errors?)\b", text.splitlines()[-1] if text else ""):
        counts[kind.rstrip("s")] += int(number)
    return f"{counts['passed']}/{counts['failed']}/{counts['error']}"


def _last_figures(text: str) -> str:
    """The last line of a benchmark made of ``key=value`` fields (after its name, ``name:``, where it has one), or
    ``-``."""
    for line in reversed(text.splitlines()):
        fields = line.split()
        fields = fields[1:] if fields and fields[0].endswith(":") else fields
        if fields and all("=" in field for field in fields):
            return " ".join(fields)
    return "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for each step's log and JSON")
    parser.add_argument("--data-root", default=None, help="MNIST in torchvision's layout, for gpu.py")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    parser.add_argument("--quick", action="store_true", help="shorter gpu.py and throughput runs (fewer rounds)")
    parser.add_argument(
        "--limits", default="180,200,150,120,150", help=f"seconds allowed to {', '.join(STEPS)}, in that order"
    )
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_suite: found no CUDA GPU (torch.cuda.is_available() is False); nothing run")
        return 0
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"--steps names {unknown}; choose from {', '.join(STEPS)}")
    given = args.limits.split(",")
    if len(given) != len(STEPS):
        parser.error(f"--limits={args.limits} gives {len(given)} limits; give {len(STEPS)}, for {', '.join(STEPS)}")
    limits = dict(zip(STEPS, (float(s) for s in given)))
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RAYFED_TEST_DEVICE": "cuda", "PYTHONUNBUFFERED": "1"}
    summary = [f"device={torch.cuda.get_device_name(0).replace(' ', '_')}", f"torch={torch.__version__}"]
    all_ok = True
    if "tests" in steps:
        parallel = ["-n", "8"] if importlib.util.find_spec("xdist") else []
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *parallel, *CUDA_TESTS]
        text, ok, _ = _run("tests", command, args.out, limits["tests"], env)
        summary.append(f"tests={_pytest_counts(text)}")
        all_ok &= ok
    if "gpu" in steps:
        quick = ["--rounds", "3", "--repeats", "1", "--clients", "20,100"] if args.quick else []
        data = ["--data-root", args.data_root] if args.data_root else []
        command = [sys.executable, "benchmarks/gpu.py", *quick, *data, "--out", str(args.out / "gpu.json")]
        text, ok, _ = _run("gpu", command, args.out, limits["gpu"], env)
        summary.append(_last_figures(text))
        all_ok &= ok
    if "throughput" in steps:
        rounds = ["--rounds", "4"] if args.quick else []
        command = [
            sys.executable,
            "benchmarks/throughput.py",
            "--workers",
            "2",
            *rounds,
            "--out",
            str(args.out / "throughput.json"),
        ]
        text, ok, _ = _run("throughput", command, args.out, limits["throughput"], env)
        summary.append(_last_figures(text))
        all_ok &= ok
    if "packing" in steps:
        data = ["--data-root", args.data_root] if args.data_root else []
        command = [sys.executable, "benchmarks/packing.py", "--gpu", *data]
        text, ok, _ = _run("packing", command, args.out, limits["packing"], env)
        summary.append(_last_figures(text))
        all_ok &= ok
    if "packed_round" in steps:
        quick = ["--quick"] if args.quick else []
        data = ["--data-root", args.data_root] if args.data_root else []
        out = ["--out", str(args.out / "packed_round.json")]
        command = [sys.executable, "benchmarks/packed_round.py", *quick, *data, *out]
        text, ok, _ = _run("packed_round", command, args.out, limits["packed_round"], env)
        summary.append(_last_figures(text))
        all_ok &= ok
    print("gpu_suite: " + " ".join(summary), flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
