"""What of a method's uploads differential privacy protects (``privacy.mechanism``, docs/privacy.md): declared by
its server half, never guessed from its code.

* :class:`ModelUpload`: its clients upload their trained model whole, weighted by their training samples
  (:class:`~rayfed.algorithms.contributions.WeightedState` without parts), all from the one model θ_g the server
  broadcast, and it aggregates their average (FedAvg's family: FedProx, FedAdam, FedUV, SGDM, Ditto's global
  track). DP-FedAvg protects such an upload whole: the worker clips θ_i − θ_g, the server noises the sum.
* :class:`PartwiseUpload`: its clients upload several parts (:attr:`PartwiseUpload.upload_parts`), each an
  update or a statistic with its own L2 bound (:class:`UploadPart`). Its client half says what each client's
  parts are (:class:`PartwiseClient`); the worker clips each part to its bound, lane by lane, and sums them
  weighted (:class:`PrivateParts`); the server noises each part's sum with the Gaussian of its own bound and
  hands the noised sums to the server half. Together the parts' P Gaussian mechanisms on the same clients are one
  Gaussian mechanism whose multiplier is (Σ_k z_k⁻²)^(−1/2); each part gets z_k = z·√P, so the run's ε is the
  configured z's, as for a model (docs/privacy.md, "Methods that upload more than a model").
* :class:`ModelRowsUpload`: its clients upload their trained model whole, one row each
  (:class:`~rayfed.algorithms.contributions.ClientVectors`), from the θ_g the server broadcast, and it keeps each
  row for the server step the row arrives at (asynchronous aggregation: FedAsync, FedBuff). The worker clips each
  row as a model update (and with local DP noises it); the server counts a launch whose update was rejected as a
  zero update and noises each step's staleness-weighted sum (docs/privacy.md, "Asynchronous aggregation").
* :class:`UploadBeyondModel`: its clients upload more than a model or a model delta, and it names what
  (FedAWA's client vectors, FedProto's prototypes, KT-pFL's soft labels): a run with privacy is refused in one
  line that says so.

A method that declares none of them is refused too: its upload is not known to be one the mechanism can bound.
What never leaves a client (a personal model, a head kept local) needs no noise and is not an upload.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rayfed.algorithms.contributions import WeightedSum

if TYPE_CHECKING:
    from rayfed.train.job import ClientJob

__all__ = [
    "ModelUpload",
    "ModelRowsUpload",
    "StepNoise",
    "UploadPart",
    "PartwiseUpload",
    "PartwiseClient",
    "PrivateParts",
    "UploadBeyondModel",
    "privacy_refusal",
    "part_multiplier",
    "declared_parts",
    "mass_weighted_step",
    "PROTECTED",
]

PROTECTED = (
    "fedavg, fedprox, fedadam, feduv, sgdm, ditto, feddyn, fedper, fedrep, lgfedavg, fedbabu, cwfedavg, fedproto, "
    "fedasync, fedbuff"
)
"""The methods a refusal names as protected (docs/privacy.md, "Which methods it protects")."""


class ModelUpload(abc.ABC):
    """A server half whose clients each upload their trained model whole, weighted by their training samples, from
    the model :meth:`privacy_reference` (a :class:`~rayfed.algorithms.contributions.WeightedState` without parts),
    and which aggregates the :class:`~rayfed.algorithms.contributions.WeightedSum`'s average."""

    @abc.abstractmethod
    def privacy_reference(self) -> np.ndarray:
        """θ_g, the model this round's clients started from (its broadcast's): the origin their updates are
        clipped around, and the upload of a client the round planned that sent none (a zero update)."""

    @classmethod
    def privacy_conflict(cls, params: Any, privacy: Any) -> str:
        """Why ``privacy`` (a :class:`~rayfed.privacy.settings.PrivacyConfig`) cannot protect the method run with
        ``params``, in one line naming the fix; "" where it can (every method but one whose rule fixes what the
        privacy settings also fix: FedDyn's unweighted ``paper`` mean against ``privacy.weighting='samples'``)."""
        return ""


StepNoise = Callable[[int, int, float], np.ndarray | None]
"""``(round, size, bound) -> noise``: the Gaussian noise of the server step of round ``round`` on a sum of ``size``
numbers to which one client adds at most ``bound`` clipped updates' worth (its staleness weights summed); None
where the mechanism adds none (local DP, or no noise)."""


class ModelRowsUpload(abc.ABC):
    """A server half whose clients each upload their trained model whole as one row of a
    :class:`~rayfed.algorithms.contributions.ClientVectors`, from the θ_g it broadcast, and which keeps each row for
    the server step it arrives at (module docstring). With privacy on, the server hands it :meth:`protect`."""

    @abc.abstractmethod
    def protect(self, noise: StepNoise) -> None:
        """From now on count every launch the round planned whose update did not arrive (rejected) as a zero update,
        and add ``noise`` to each step's kept sum before the step (docs/privacy.md)."""

    @classmethod
    @abc.abstractmethod
    def privacy_conflict(cls, params: Any, privacy: Any) -> str:
        """Why ``privacy`` (a :class:`~rayfed.privacy.settings.PrivacyConfig`) cannot protect the method run with
        ``params``, in one line naming the fix; "" where it can."""


@dataclass(frozen=True)
class UploadPart:
    """One part of a client's upload that privacy bounds on its own."""

    name: str
    """What it is, as docs/privacy.md names it ("model update", "class masses")."""
    bound: float | None = None
    """Its L2 bound for a client of weight 1: None for an update, clipped to ``privacy.clip_norm``; a number for a
    statistic bounded by what it is (a probability row: ‖p‖₂ ≤ ‖p‖₁ = 1), clipped to it all the same."""

    def norm(self, clip_norm: float) -> float:
        """The part's bound in a run clipping updates to ``clip_norm`` (with adaptive clipping: its first round's)."""
        return clip_norm if self.bound is None else self.bound

    @property
    def ceiling(self) -> float:
        """The most its adaptive bound may grow to: a statistic's own bound (beyond it a clip bounds nothing more),
        none for an update."""
        return math.inf if self.bound is None else self.bound


class PartwiseUpload(abc.ABC):
    """A server half whose clients upload :attr:`upload_parts`, each clipped to its own bound; with privacy on its
    ``aggregate`` receives :class:`PrivateParts`: the noised weighted sums of the parts, over the planned weight."""

    upload_parts: ClassVar[tuple[UploadPart, ...]] = ()

    @abc.abstractmethod
    def part_sizes(self) -> tuple[int, ...]:
        """How many numbers each part has (in :attr:`upload_parts`'s order): the zero sums of a round in which no
        upload arrived, which the server noises all the same (every round releases what the accountant counts)."""


class PartwiseClient(abc.ABC):
    """The client half of a :class:`PartwiseUpload` method: what each client's parts are."""

    @abc.abstractmethod
    def private_parts(self, message: Any, job: ClientJob, upload: Any) -> tuple[Any, ...]:
        """The client's parts, unclipped and unweighted, one 1-D tensor on its device per declared part (in
        :attr:`PartwiseUpload.upload_parts`'s order), from its trained model (``job.trained``) or from ``upload``,
        what its ``upload`` hook returned (which is not sent)."""


@dataclass
class PrivateParts(WeightedSum):
    """Σ_i w_i x̃_i of clients' clipped parts, concatenated in declared order (``sizes`` each), and Σ_i w_i. On the
    server, once noised, ``weight`` is the round's planned weight W_P and ``unit`` the largest weight a client can
    have (one client's share of a denominator)."""

    sizes: tuple[int, ...] = ()
    unit: float = 1.0
    unclipped: Any = 0.0
    """With adaptive clipping: per part, how many of the clients had it within its round's bound, Σ_i 1[‖x_ik‖ ≤
    B_k,t] ((P,): a numpy array, or a tensor while on a worker's device); 0.0 otherwise."""

    def __add__(self, other: WeightedSum) -> PrivateParts:
        assert isinstance(other, PrivateParts) and other.sizes == self.sizes
        total = WeightedSum.__add__(self, other)
        unclipped = self.unclipped + other.unclipped
        return PrivateParts(total.total, total.weight, total.count, self.sizes, self.unit, unclipped)

    __iadd__ = __add__

    def split(self) -> list[np.ndarray]:
        """The parts' sums, in declared order."""
        ends = np.cumsum(self.sizes)
        return [self.total[end - size : end] for end, size in zip(ends, self.sizes)]


def mass_weighted_step(previous: np.ndarray, update: np.ndarray, masses: np.ndarray, floor: float) -> np.ndarray:
    """x_j + Σ̃_i r_ij (x_ij − x_j) / max(M̃_j, floor) per row j of ``previous`` (K, d): a weighted mean per class
    written around the broadcast x_j, from the noised sums of the weighted updates (``update``, K·d) and of the
    weights (``masses``, K), the denominator held to ``floor`` (the most one client can weigh a class) so that the
    noise on a class no client holds is not magnified. Post-processing of the noised sums: it costs no privacy."""
    denominators = np.maximum(masses, np.float32(floor)).astype(np.float32)
    return (previous + update.reshape(previous.shape[0], -1) / denominators[:, None]).astype(np.float32)


def part_multiplier(noise_multiplier: float, parts: Sequence[UploadPart]) -> float:
    """z_k = z·√P: each of P parts' noise multiplier, so that the P Gaussian mechanisms on the same clients
    compose to one of multiplier (Σ_k z_k⁻²)^(−1/2) = z (docs/privacy.md; with adaptive clipping z is the updates'
    share z_Δ, :func:`rayfed.privacy.adaptive.update_noise_multiplier`)."""
    return noise_multiplier * math.sqrt(len(parts))


def declared_parts(server_half: type) -> tuple[UploadPart, ...]:
    """The parts a method's server half declares its clients upload (:class:`PartwiseUpload`); () for the others."""
    return server_half.upload_parts if issubclass(server_half, PartwiseUpload) else ()


class UploadBeyondModel:
    """A server half whose clients upload more than a model or a model delta."""

    beyond_model: ClassVar[str] = ""
    """What its upload carries that a model's clipping does not bound ("its client vectors", ...)."""


def privacy_refusal(method: str, server_half: type, mechanism: str) -> str:
    """Why ``privacy.mechanism=mechanism`` cannot protect ``method``'s uploads (its server half ``server_half``);
    "" where it declares :class:`ModelUpload` or :class:`PartwiseUpload`."""
    if issubclass(server_half, ModelUpload | PartwiseUpload | ModelRowsUpload):
        return ""
    what: Any = server_half.beyond_model if issubclass(server_half, UploadBeyondModel) else ""
    why = (
        f"its clients also upload {what}, which clipping a model update does not bound"
        if what
        else "its upload is not declared a model (rayfed.algorithms.private_uploads.ModelUpload)"
    )
    return (
        f"privacy.mechanism={mechanism!r} cannot protect algorithm.name={method!r}: {why}; use a method whose "
        f"upload it protects ({PROTECTED}) or privacy.mechanism='off'"
    )
