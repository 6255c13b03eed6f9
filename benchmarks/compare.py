"""One benchmark run on two versions of rayfed in turn: a base commit (``main``) against this working tree.

    python benchmarks/compare.py --base main [--runs 3] [--script throughput.py] [-- SCRIPT ARGUMENTS]

On a box shared with others, hold the heavy lock around it:
``flock /tmp/rayfed-heavy.lock python benchmarks/compare.py --base main``.

The base is exported with ``git archive`` into a temporary folder (no worktree is registered, nothing in the
repository changes); the head is this checkout as it stands, uncommitted changes included, or ``--head REF``
exported the same way. Both are measured by one benchmark, the head's ``benchmarks/<script>`` (its yardsticks, such
as the plain loops, stay the same): each run is a fresh process of this interpreter running it from a version's
root with that version first on ``PYTHONPATH``, so that the driver and Ray's workers (which inherit the variable)
import that version's ``rayfed``. The runs alternate in the order ABBA ABBA ... (base, head, head, base, ...): a
drift in the box's speed, linear over a pair of pairs, weighs on both alike.

A benchmark's last line is its ``key=value`` summary (every script here ends with one). compare.py prints each
run's, then per key the mean and standard deviation over the runs of each version and the ratio of the means;
its own last line::

    runs=<n> <key>_base=<mean> <key>_head=<mean> <key>_head_over_base=<ratio> ...

Default script arguments: ``throughput.py --rounds 6 --no-pss`` (the throughput limit without the PSS run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ARGUMENTS = {"throughput.py": ["--rounds", "6", "--no-pss"]}


def export(ref: str, into: Path) -> Path:
    """The tree of commit ``ref`` written into ``into`` (``git archive``); ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def summary(line: str) -> dict[str, float]:
    """The numeric ``key=value`` pairs of a benchmark's last line."""
    values = {}
    for word in line.split():
        key, _, value = word.partition("=")
        try:
            values[key] = float(value)
        except ValueError:
            continue
    return values


def run_once(tree: Path, script: Path, arguments: list[str]) -> dict[str, float]:
    """Run ``script`` with ``tree``'s rayfed; its summary (its output goes to stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, str(script), *arguments],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    sys.stderr.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"compare.py: {script} failed in {tree} (status {done.returncode})")
    lines = done.stdout.strip().splitlines()
    return summary(lines[-1]) if lines else {}


def order(runs: int) -> list[str]:
    """ABBA ABBA ...: ``runs`` runs of each version."""
    pattern = ["base", "head", "head", "base"]
    return [pattern[i % 4] for i in range(2 * runs)]


def report(results: dict[str, list[dict[str, float]]]) -> str:
    """Per key, each version's mean ± standard deviation (printed) and the last line's fields (returned)."""
    keys = [k for k in results["base"][0] if all(k in r for version in results.values() for r in version)]
    fields = [f"runs={len(results['base'])}"]
    for key in keys:
        base = [r[key] for r in results["base"]]
        head = [r[key] for r in results["head"]]
        spread = {name: statistics.stdev(v) if len(v) > 1 else 0.0 for name, v in (("base", base), ("head", head))}
        ratio = statistics.mean(head) / statistics.mean(base) if statistics.mean(base) else float("nan")
        print(
            f"{key}: base {statistics.mean(base):.4f} ± {spread['base']:.4f} ({', '.join(f'{v:.3f}' for v in base)}); "
            f"head {statistics.mean(head):.4f} ± {spread['head']:.4f} ({', '.join(f'{v:.3f}' for v in head)}); "
            f"head / base {ratio:.3f}"
        )
        fields += [
            f"{key}_base={statistics.mean(base):.4f}",
            f"{key}_head={statistics.mean(head):.4f}",
            f"{key}_head_over_base={ratio:.4f}",
        ]
    return " ".join(fields)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    script_args = argv[argv.index("--") + 1 :] if "--" in argv else None
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="the commit (branch, tag) to compare with (default main)")
    parser.add_argument("--head", default=None, help="the commit to measure (default: this working tree as it is)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each version, interleaved ABBA (default 3)")
    parser.add_argument("--script", default="throughput.py", help="the benchmark, a file in benchmarks/")
    args = parser.parse_args(own)
    arguments = script_args if script_args is not None else DEFAULT_ARGUMENTS.get(args.script, [])
    with tempfile.TemporaryDirectory(prefix="rayfed-compare-") as tmp:
        trees = {"base": export(args.base, Path(tmp) / "base"), "head": ROOT}
        if args.head is not None:
            trees["head"] = export(args.head, Path(tmp) / "head")
        print(f"base {args.base} in {trees['base']}; head {args.head or 'this working tree'} in {trees['head']}")
        results: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
        script = trees["head"] / "benchmarks" / args.script
        for i, version in enumerate(order(args.runs)):
            values = run_once(trees[version], script, arguments)
            results[version].append(values)
            print(f"run {i + 1} ({version}): " + " ".join(f"{k}={v:g}" for k, v in values.items()), flush=True)
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
