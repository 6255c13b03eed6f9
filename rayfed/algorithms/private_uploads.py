"""What of a method's uploads differential privacy protects (``privacy.mechanism``, docs/privacy.md): declared by
its server half, never guessed from its code.

* :class:`ModelUpload`: its clients upload their trained model whole, weighted by their training samples
  (:class:`~rayfed.algorithms.contributions.WeightedState` without parts), all from the one model θ_g the server
  broadcast, and it aggregates their average (FedAvg's family: FedProx, FedAdam, FedUV, SGDM, Ditto's global
  track). DP-FedAvg protects such an upload whole: the worker clips θ_i − θ_g, the server noises the sum.
* :class:`UploadBeyondModel`: its clients upload more than a model or a model delta, and it names what
  (cwFedAvg's class distributions, FedAWA's client vectors, FedProto's prototypes, KT-pFL's soft labels): a run
  with privacy is refused in one line that says so.

A method that declares neither is refused too: its upload is not known to be one the mechanism can bound.
What never leaves a client (a personal model, a head kept local) needs no noise and is not an upload.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np

__all__ = ["ModelUpload", "UploadBeyondModel", "privacy_refusal"]


class ModelUpload(abc.ABC):
    """A server half whose clients each upload their trained model whole, weighted by their training samples, from
    the model :meth:`privacy_reference` (a :class:`~rayfed.algorithms.contributions.WeightedState` without parts),
    and which aggregates the :class:`~rayfed.algorithms.contributions.WeightedSum`'s average."""

    @abc.abstractmethod
    def privacy_reference(self) -> np.ndarray:
        """θ_g, the model this round's clients started from (its broadcast's): the origin their updates are
        clipped around, and the upload of a client the round planned that sent none (a zero update)."""


class UploadBeyondModel:
    """A server half whose clients upload more than a model or a model delta."""

    beyond_model: ClassVar[str] = ""
    """What its upload carries that a model's clipping does not bound ("its class distributions", ...)."""


def privacy_refusal(method: str, server_half: type, mechanism: str) -> str:
    """Why ``privacy.mechanism=mechanism`` cannot protect ``method``'s uploads (its server half ``server_half``);
    "" where it declares :class:`ModelUpload`."""
    if issubclass(server_half, ModelUpload):
        return ""
    what: Any = server_half.beyond_model if issubclass(server_half, UploadBeyondModel) else ""
    why = (
        f"its clients also upload {what}, which clipping a model update does not bound"
        if what
        else "its upload is not declared a model (rayfed.algorithms.private_uploads.ModelUpload)"
    )
    return (
        f"privacy.mechanism={mechanism!r} cannot protect algorithm.name={method!r}: {why}; use a method whose "
        "upload is its model (fedavg, fedprox, fedadam, feduv, sgdm, ditto) or privacy.mechanism='off'"
    )
