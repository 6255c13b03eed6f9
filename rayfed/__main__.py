"""``python -m rayfed``: the same command line as ``rayfed``."""

from rayfed.cli import main

raise SystemExit(main())
