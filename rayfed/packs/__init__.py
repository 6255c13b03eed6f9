"""Runs that share a model share one stack: :func:`run_many` (docs/architecture.md, "How clients are packed into
lanes")."""

from rayfed.packs.run_many import run_many

__all__ = ["run_many"]
