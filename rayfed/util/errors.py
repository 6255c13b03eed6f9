"""Domain errors of rayfed.

Every error names what is wrong, the value received and what is allowed, so that
a user can fix the input without reading the source. Low-level errors are
re-raised ``from`` the original exception, naming the config field to blame.
"""

from __future__ import annotations

import traceback

__all__ = [
    "RayfedError",
    "ConfigError",
    "DatasetError",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointKeyError",
    "ResourceError",
    "DiskFullError",
    "WorkerError",
    "ServerError",
    "MethodError",
    "PluginError",
    "raised_at",
]


class RayfedError(Exception):
    """Base class of every error rayfed raises on purpose."""


class ConfigError(RayfedError, ValueError):
    """A configuration field holds a value that is not allowed."""


class DatasetError(RayfedError):
    """A dataset cannot be loaded or partitioned as requested."""


class CheckpointError(RayfedError):
    """A run directory or checkpoint is missing, truncated or corrupted."""


class CheckpointFormatError(CheckpointError):
    """A checkpoint is intact but was written in a state layout this rayfed does not read."""


class CheckpointKeyError(CheckpointFormatError):
    """A checkpoint was sealed with a key this machine does not hold (or before checkpoints were keyed): it
    cannot be verified here, and is kept."""


class ResourceError(RayfedError):
    """The requested compute resources (CPUs, GPUs) are not available."""


class DiskFullError(ResourceError):
    """A file could not be written because the disk (or the user's quota) holding it is full."""


class WorkerError(RayfedError):
    """A batch of clients failed on every worker it was given (``engine.max_retries`` re-runs used up)."""


class ServerError(RayfedError):
    """The ServerActor died in a round on every restart (``engine.max_retries`` restarts used up)."""


class MethodError(RayfedError):
    """A registered method breaks the contract it is written against (a phase it declares, what a hook of it
    returns): the error names the method, the hook or phase, the field and the fix."""


class PluginError(RayfedError):
    """A method, model, dataset or partitioner registered outside rayfed cannot reach a process of the run (it
    cannot be sent, or the module that registers it cannot be imported there)."""


def raised_at(error: BaseException, file: str | None = None) -> str:
    """Where ``error`` was raised, as ``FILE:LINE``: in ``file`` if the traceback passes through it (the plugin that
    failed, rather than the library it called), else the innermost frame outside Python's import machinery; a
    SyntaxError's own place; ``"an unknown line"`` without a traceback."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}:{error.lineno}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<frozen")]
    chosen = [f for f in frames if f.filename == file] or frames
    return f"{chosen[-1].filename}:{chosen[-1].lineno}" if chosen else "an unknown line"
