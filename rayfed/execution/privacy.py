"""DP-FedAvg where the halves run (docs/privacy.md): the worker clips (and with local DP noises) each client's
upload, the server noises the round's sum once and averages it over the clients the round planned.

Off (``privacy.mechanism="off"``) neither exists and no number changes. On, only a method whose server half
declares :class:`~rayfed.algorithms.private_uploads.ModelUpload` runs (the plan refuses the others), and its
clients' uploads are checked to be the model it declares.

Worker, client i of the round (θ_g its start, n_i its training samples, w_i its weight: 1, or n_i with
``privacy.weighting="samples"``)::

    θ̃_i = θ_g + Δ_i · min(1, C/‖Δ_i‖)         (rayfed.privacy.clipping; θ_i itself where ‖Δ_i‖ ≤ C)
    local DP: θ̃_i += N(0, σ² I)               (σ = z·C, seeded by the run, the round and the client)
    upload w_i θ̃_i and w_i                     (a stack's in one product)

Server, the round planned the set P and received U ⊆ P (Σ_U w_i θ̃_i, Σ_U w_i)::

    θ_g' = (Σ_U w_i θ̃_i + (W_P − W_U) θ_g + N(0, (σ w_max)² I)) / W_P      (central; no noise with local DP)

W_P = Σ_P w_i is fixed by the plan, not by who reported (McMahan et al. 2018's fixed denominator); a planned
client that sent nothing counts as a zero update. w_max is the largest weight any client can have (1, or the
largest training split), the sum's sensitivity in units of the clip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rayfed.algorithms import Contribution, RoundContext
from rayfed.algorithms.contributions import WeightedState, WeightedSum
from rayfed.algorithms.private_uploads import ModelUpload
from rayfed.config import RunConfig
from rayfed.privacy.noise import SERVER_STREAM, gaussian_noise
from rayfed.util.errors import ConfigError

__all__ = ["ClientPrivacy", "ServerPrivacy"]


class ClientPrivacy:
    """A worker's clipping (and local noise) of its clients' model uploads."""

    def __init__(self, config: RunConfig, method: str) -> None:
        self.privacy, self.seed, self.method = config.privacy, config.seed, method

    def weights(self, sizes: Sequence[int]) -> list[int]:
        """w_i of clients of ``sizes`` training samples: n_i (``weighting="samples"``) or 1."""
        return list(sizes) if self.privacy.weighting == "samples" else [1] * len(sizes)

    def clipped(
        self, uploads: Sequence[Any], trained: Any, starts: Any, client_ids: Sequence[int], round_index: int
    ) -> Any:
        """The clipped (and locally noised) models of clients ``client_ids`` (L, S) from their trained states and
        starts (L, S), on their device; each of ``uploads`` must be the whole-model :class:`WeightedState`."""
        from rayfed.privacy.clipping import clipped_model
        from rayfed.train.host import to_device

        for upload in uploads:
            if not isinstance(upload, WeightedState) or upload.parts:
                raise ConfigError(
                    f"privacy.mechanism={self.privacy.mechanism!r}: algorithm {self.method!r} declares its upload "
                    f"a whole model (ModelUpload) but its client uploaded {type(upload).__name__}"
                    f"{' of parts' if isinstance(upload, WeightedState) else ''}: set privacy.mechanism='off'"
                )
        models = clipped_model(trained, starts, self.privacy.clip_norm)
        if self.privacy.mechanism != "local" or self.privacy.noise_std == 0:
            return models
        size = trained.shape[-1]
        noise = np.stack(
            [gaussian_noise(self.seed, round_index, 1 + cid, size, self.privacy.noise_std) for cid in client_ids]
        )
        return models + to_device([noise], models.device)[0]

    def one(self, uploads: Sequence[Any], job: Any, start: Any) -> WeightedSum:
        """One client's upload (``uploads``: what its client half declared): its clipped model weighted by w_i."""
        model = self.clipped(uploads, job.trained[None, :], start[None, :], [job.client_id], job.round)[0]
        return WeightedSum.of(model, self.weights([job.num_train])[0])

    def stack(
        self, uploads: Sequence[Any], jobs: Sequence[Any], states: Any, starts: Any
    ) -> tuple[WeightedSum, list[Any]]:
        """A stack's summed upload (one product) and each client's, from the stack's trained states and starts."""
        models = self.clipped(uploads, states, starts, [job.client_id for job in jobs], jobs[0].round)
        weights = self.weights([job.num_train for job in jobs])
        parts = [WeightedSum.of(models[row], weight) for row, weight in enumerate(weights)]
        return WeightedState().of_stack(models, weights), parts


class ServerPrivacy:
    """The server's half of the mechanism: the fixed denominator and, for central DP, the round's noise."""

    def __init__(self, config: RunConfig, train_sizes: np.ndarray | None) -> None:
        self.privacy, self.seed = config.privacy, config.seed
        samples = self.privacy.weighting == "samples"
        if samples and train_sizes is None:
            raise ValueError("privacy.weighting='samples' needs the clients' training sizes on the server")
        self.sizes = train_sizes if samples else None
        self.max_weight = float(np.max(train_sizes)) if samples and train_sizes is not None else 1.0

    def planned_weight(self, ctx: RoundContext) -> float:
        """W_P: the weights of the clients the round planned."""
        return float(len(ctx.sampled)) if self.sizes is None else float(np.sum(self.sizes[ctx.sampled]))

    def privatized(self, ctx: RoundContext, total: Contribution, half: Any) -> WeightedSum:
        """The round's sum as the server half folds it: completed to the planned weight with θ_g and noised
        (module docstring)."""
        assert isinstance(total, WeightedSum) and isinstance(half, ModelUpload)  # the plan refused the rest
        planned = self.planned_weight(ctx)
        summed = total.total
        if planned != total.weight:  # a planned client sent nothing: a zero update, θ_g
            summed = summed + np.float32(planned - total.weight) * half.privacy_reference()
        std = self.privacy.noise_std * self.max_weight
        if self.privacy.mechanism == "central" and std > 0:
            summed = summed + gaussian_noise(self.seed, ctx.round, SERVER_STREAM, summed.shape[0], std)
        return WeightedSum(summed, planned, total.count)
