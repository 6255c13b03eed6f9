"""A client half whose local training is borrowed from another algorithm (``algorithm.client``).

``algorithm.name="fedawa", algorithm.client="fedprox"`` runs FedAWA's clients with FedProx's local objective:
the run's own client half (FedAWA's) starts each client, uploads and evaluates, as its server reads and sends;
the borrowed one declares the phases (:meth:`ClientHalf.phases`), and nothing else of it runs. Its phases are
called with the run's message, which need not be its own algorithm's: a client half lent this way reads from it
only what every message has, or nothing (FedProx's proximal term anchors at the round's start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayfed.algorithms.hooks import ClientHalf, Contribution, Start
from rayfed.util.errors import MethodError

if TYPE_CHECKING:
    from rayfed.algorithms.contributions import WeightedState
    from rayfed.train.job import ClientJob
    from rayfed.train.phase import Phase

__all__ = ["BorrowedTraining"]


class BorrowedTraining(ClientHalf[Any, Any]):
    """``own``'s client (start, upload, evaluation), training ``training``'s phases."""

    def __init__(self, own: ClientHalf[Any, Any], training: ClientHalf[Any, Any], names: tuple[str, str]) -> None:
        super().__init__(own.params, own.spec)
        self.own, self.training, self.names = own, training, names

    def start(self, message: Any, job: ClientJob) -> Start:
        return self.own.start(message, job)

    def phases(self, message: Any, job: ClientJob) -> list[Phase]:
        try:
            return self.training.phases(message, job)
        except AttributeError as error:  # a field of the run's message or start, which the lent half expects its own
            lent, name = self.names
            if error.obj is message:
                lacks = f"a message {name!r} does not send"
            elif error.obj is job.start:
                lacks = f"a start (job.start) the client half of {name!r} does not make"
            else:  # the lent method's own error: raised as it is
                raise
            raise MethodError(
                f"algorithm.client={lent!r} lends its phases to algorithm.name={name!r}, but they read {lacks} "
                f"({error}); lend a client half whose phases read nothing of their own algorithm's message or start "
                "(fedprox, sgdm, ditto, feduv, ...)"
            ) from error

    def upload(self, message: Any, job: ClientJob) -> Contribution | WeightedState:
        return self.own.upload(message, job)

    def evaluation(self, message: Any, job: ClientJob) -> Any:
        return self.own.evaluation(message, job)

    def fine_tuning(self, message: Any, job: ClientJob) -> list[Phase]:
        return self.own.fine_tuning(message, job)

    def global_model(self, message: Any, job: ClientJob) -> Any | None:
        return self.own.global_model(message, job)

    def bytes_down(self, message: Any, job: ClientJob) -> int:
        return self.own.bytes_down(message, job)
