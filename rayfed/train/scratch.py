"""Typed per-job scratch space: values one hook of an algorithm hands to a later hook of the same job.

An algorithm's hooks run in turn on one :class:`~rayfed.train.job.ClientJob` (``personalise``,
``train``, ``contribute``, ``bytes_down``, ...). What one hook computes for a later one, such as
the cluster IFCA's client chose or the prototypes FedNH broadcast, goes through ``job.scratch``.
Each value is stored under a :class:`ScratchKey` that carries the value's type, so reading it
back is type-checked without casts::

    CLUSTER = ScratchKey[int]("ifca.cluster")
    job.scratch[CLUSTER] = 2
    cluster: int = job.scratch[CLUSTER]

The scratch lives as long as the job: nothing in it is persisted (that is ``job.state``).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

__all__ = ["ScratchKey", "Scratch"]

T = TypeVar("T")
D = TypeVar("D")
_MISSING: Any = object()


class ScratchKey(Generic[T]):
    """The name of one scratch slot and, for the type checker, the type of its value."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"ScratchKey({self.name!r})"


class Scratch:
    """A job's scratch values, keyed by :class:`ScratchKey` (compared by identity)."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[ScratchKey[Any], Any] = {}

    def __setitem__(self, key: ScratchKey[T], value: T) -> None:
        self._values[key] = value

    def __getitem__(self, key: ScratchKey[T]) -> T:
        try:
            value: T = self._values[key]
        except KeyError:
            raise KeyError(f"no scratch value {key.name!r} in this job: the hook that sets it has not run") from None
        return value

    def __contains__(self, key: ScratchKey[Any]) -> bool:
        return key in self._values

    @overload
    def get(self, key: ScratchKey[T]) -> T | None: ...
    @overload
    def get(self, key: ScratchKey[T], default: D) -> T | D: ...
    def get(self, key: ScratchKey[Any], default: Any = None) -> Any:
        """The value under ``key``, or ``default`` when no hook set one."""
        return self._values.get(key, default)

    @overload
    def pop(self, key: ScratchKey[T]) -> T: ...
    @overload
    def pop(self, key: ScratchKey[T], default: D) -> T | D: ...
    def pop(self, key: ScratchKey[Any], default: Any = _MISSING) -> Any:
        """Remove and return the value under ``key`` (``default`` if given and none is set)."""
        if key in self._values or default is _MISSING:
            value = self[key]  # a missing key without a default raises the KeyError that names it
            del self._values[key]
            return value
        return default
