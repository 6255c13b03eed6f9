"""Moved to ``rayfed reproduce`` (README.md, "Results"); this script forwards to it.

    python benchmarks/reproduce_tables.py cwfedavg-mnist --data-root ~/data --rounds 20 [--record]
    python benchmarks/reproduce_tables.py --table fedawa --data-root ~/data --rounds 20   # old spelling

is ``rayfed reproduce cwfedavg-mnist ...``; the old ``--table cwfedavg`` / ``--table fedawa``
name the tables ``cwfedavg-mnist`` / ``fedawa-mnist``. The results go to ``--out``, with ``--record``
to the tracked ``benchmarks/results``, and otherwise to ``runs/reproduce`` (ignored by git), so that
measuring never dirties the tree. ``rayfed reproduce --list`` shows every table.
"""

from __future__ import annotations

import sys

from rayfed.cli import main as rayfed_main

_OLD_NAMES = {"cwfedavg": "cwfedavg-mnist", "fedawa": "fedawa-mnist"}


def translate(argv: list[str]) -> list[str]:
    """The ``rayfed`` arguments for this script's: ``--table NAME`` becomes the table argument."""
    args = list(argv)
    if "--table" in args:
        i = args.index("--table")
        name = args[i + 1] if i + 1 < len(args) else ""
        del args[i : i + 2]
        args.insert(0, _OLD_NAMES.get(name, name))
    if "--record" in args:
        if "--out" in args:
            raise SystemExit("reproduce_tables.py: --record writes to benchmarks/results; leave out --out")
        args.remove("--record")
        args += ["--out", "benchmarks/results"]
    elif "--out" not in args:
        args += ["--out", "runs/reproduce"]
    return ["reproduce", *args]


def main(argv: list[str] | None = None) -> int:
    return rayfed_main(translate(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
