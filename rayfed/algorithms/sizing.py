"""What an algorithm's state weighs: the small protocol the engine reads before a run starts.

:class:`StateSizes` is what a server half declares, opt-in, when its method's state differs from the default
(one model per client that keeps state, two on the server): how many bytes a client keeps between rounds, how
many the server holds, and which server arrays may hold NaN. A server half subclasses it to say so; the engine
reads :func:`sizes_of` a server half, its own declaration or the default. :mod:`rayfed.engine.sizing` reads it
to refuse, before anything is written, a run whose states fit neither memory nor disk;
:mod:`rayfed.engine.checkpoint` reads ``may_hold_nan`` to refuse the state of a run that diverged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rayfed.train.problem import ProblemSpec

if TYPE_CHECKING:
    from rayfed.train.settings import TrainConfig

__all__ = [
    "StateSizes",
    "sizes_of",
    "model_state_bytes",
    "architecture_state_bytes",
    "parameter_bytes",
    "buffer_bytes",
    "momentum_bytes",
]


class StateSizes:
    """Bytes of an algorithm's state, by default one model per client that keeps state and two on the server."""

    may_hold_nan: ClassVar[frozenset[str]] = frozenset()
    """Names of ``state_dict`` arrays in which NaN is a value ("not set yet", as FedAWA's weights of
    clients it has not seen). A resume refuses a checkpoint with NaN or infinite values anywhere else
    (:func:`rayfed.engine.checkpoint.verified_checkpoint`): the state of a run that diverged."""

    @classmethod
    def client_state_bytes(cls, params: Any, spec: ProblemSpec, train: TrainConfig) -> int:
        """Bytes of state one client keeps between rounds, for an algorithm registered with
        ``keeps_client_state``: what its clients really keep under ``params`` and the run's local training
        (``train``: a momentum buffer exists only with ``train.momentum`` > 0). By default one model,
        parameters and floating-point buffers in float32, of the run's largest architecture. An algorithm
        whose clients keep less (cwFedAvg's BatchNorm buffers, FedPer's head, a momentum buffer) or more
        (APPLE's copies of every client's model) says so here: the engine refuses a run whose clients'
        states fit neither ``engine.client_state_memory_mb`` nor the free disk of the run directory
        (:func:`rayfed.engine.sizing.check_client_states`)."""
        return model_state_bytes(spec)

    @classmethod
    def server_state_bytes(cls, params: Any, spec: ProblemSpec) -> int:
        """Bytes the server half holds while it aggregates (:func:`rayfed.engine.sizing.estimate_memory`); by
        default two models of the largest architecture, the global model and the sum it is aggregated from."""
        return 2 * model_state_bytes(spec)


def sizes_of(server_half: type) -> type[StateSizes]:
    """The sizes a server half declares (it subclasses :class:`StateSizes`), else the default ones."""
    return server_half if issubclass(server_half, StateSizes) else StateSizes


def model_state_bytes(spec: ProblemSpec) -> int:
    """Bytes of one float32 model state (parameters, then floating-point buffers) of the largest architecture."""
    return max((architecture_state_bytes(spec, arch) for arch in spec.layouts), default=0)


def architecture_state_bytes(spec: ProblemSpec, architecture: str) -> int:
    """Bytes of one float32 model state (parameters, then floating-point buffers) of ``architecture``."""
    return 4 * sum(_sizes(spec, architecture))


def parameter_bytes(spec: ProblemSpec) -> int:
    """Bytes of one float32 parameter vector (no buffers) of the largest architecture: a momentum buffer."""
    return 4 * max((_sizes(spec, arch)[0] for arch in spec.layouts), default=0)


def buffer_bytes(spec: ProblemSpec) -> int:
    """Bytes of one model's floating-point buffers (BatchNorm statistics) in float32, of the architecture that
    has the most."""
    return 4 * max((_sizes(spec, arch)[1] for arch in spec.layouts), default=0)


def momentum_bytes(spec: ProblemSpec, train: TrainConfig) -> int:
    """What a client that carries its SGD momentum buffer across rounds keeps: one parameter vector with
    ``train.momentum`` > 0, nothing without momentum."""
    return parameter_bytes(spec) if train.momentum else 0


def _sizes(spec: ProblemSpec, architecture: str) -> tuple[int, int]:
    """(parameters, floating-point buffers) of ``architecture``."""
    buffers = spec.buffer_layouts.get(architecture)
    return spec.layouts[architecture].size, 0 if buffers is None else buffers.size
