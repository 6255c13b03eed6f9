"""What P-ICCV shows of a trained cwFedAvg run, read from its server state (``rayfed plot``):

* ``p_vs_p_tilde``: each client's true class distribution p_i beside the estimate p̃_i read from
  its output layer (Eq. 4; Fig. 2c). p̃_i is recomputed from the row norms the server keeps, so it
  is the norm-based estimate in every variant, also in "w/ Dist." where the server aggregates with
  p_i itself; a client that never uploaded has no norms yet and is left out;
* ``norms_local``: the row norms ‖W_i[j,:]‖₂ of every client's output-layer weight, clients × classes
  (Fig. 3);
* ``norms_global``: the same for the K class-specific global models G_j, model × class (Fig. 6).
"""

from __future__ import annotations

import numpy as np

from rayfed.algorithms.common.architecture import sole_architecture
from rayfed.algorithms.cwfedavg_equations import distribution_from_norms, empirical_distribution, output_row_norms
from rayfed.algorithms.cwfedavg_params import CwFedAvgParams, ModelParts, model_parts
from rayfed.algorithms.figures import DistributionPairs, Figure, FinishedRun, Heatmap

__all__ = ["cwfedavg_figures", "class_model_row_norms"]


def class_model_row_norms(heads: np.ndarray, parts: ModelParts) -> np.ndarray:
    """(K, K): the output-layer row norms of each class-specific global model G_j, from the
    class-wise parts ``heads`` (K × P_cw) the server keeps."""
    start, stop = parts.output_weight.start - parts.classwise.start, parts.output_weight.stop - parts.classwise.start
    return output_row_norms(heads[:, start:stop].reshape(len(heads), *parts.output_shape))


def cwfedavg_figures(params: CwFedAvgParams, run: FinishedRun) -> list[Figure]:
    """P-ICCV Figs. 2c, 3 and 6 of a run whose checkpoint holds cwFedAvg's server state (none otherwise)."""
    if "norms" not in run.server:
        return []
    counts = run.train_label_counts if params.p_source == "train" else run.label_counts
    p = empirical_distribution(counts)
    norms = np.asarray(run.server["norms"], dtype=np.float64)
    trained = norms.sum(axis=1) > 0  # a client that never uploaded has no norms yet
    figures: list[Figure] = [
        DistributionPairs(
            "p_vs_p_tilde",
            p[trained],
            distribution_from_norms(norms[trained]),
            tuple(np.flatnonzero(trained).tolist()),
            "p̃ (output layer)",
            "true p vs p̃ from the output layer",
        ),
        Heatmap("norms_local", norms, "client i", "output-layer row norms of the local models"),
    ]
    if "heads" in run.server:
        parts = model_parts(run.spec, sole_architecture(run.spec), params)
        figures.append(
            Heatmap(
                "norms_global",
                class_model_row_norms(np.asarray(run.server["heads"]), parts),
                "class-specific model G_j",
                "output-layer row norms of the class-specific global models",
            )
        )
    return figures
