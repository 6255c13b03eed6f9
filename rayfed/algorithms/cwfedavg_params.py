"""cwFedAvg's hyper-parameters and which part of a model's flat vector is class-wise.

Lee & Choi, "Class-Wise Federated Averaging for Efficient Personalization", ICCV 2025
("P-ICCV" below); the earlier version, "Regularizing and Aggregating Clients with Class
Distribution for Personalized Federated Learning", arXiv:2406.07800 ("P-arXiv").
See docs/algorithms.md, cwFedAvg section.

Which layers are class-wise (``classwise_blocks``, P-ICCV §4.3, Table 3): the last m
top-level blocks of the model; 0 means the whole model (P-arXiv's all-layer method).
The rest goes through FedAvg. :func:`model_parts` turns that choice into slices of the
flat parameter vector (:mod:`rayfed.train.flat`).

>>> CwFedAvgParams(variant="dist", classwise_blocks=0).label()
'cwFedAvg w/ Dist. (all layers)'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from rayfed.algorithms.common.architecture import trailing_blocks
from rayfed.train.problem import ProblemSpec
from rayfed.util.documented import documented, section
from rayfed.util.errors import ConfigError
from rayfed.util.registry import closest
from rayfed.util.validation import check_choice, check_int, check_real, fail

__all__ = ["CwFedAvgParams", "ModelParts", "model_parts"]

_PATH = "algorithm.params."
_BLOCK_LABELS = {0: "all layers", 1: "Output", 2: "FC+Output", 3: "Conv2+FC+Output"}
"""How P-ICCV Table 3 names the class-wise part of the 4-layer CNN, by ``classwise_blocks``."""
_VARIANT_LABELS = {"wdr": "", "dist": " w/ Dist.", "no_wdr": " w/o WDR"}
"""How P-arXiv Table 1 names the variants."""


@section("algorithm.params")
@dataclass(frozen=True)
class CwFedAvgParams:
    """Hyper-parameters of cwFedAvg (``algorithm.params.*``)."""

    wdr_lambda: float = documented(
        10.0,
        "λ of WDR (P-ICCV Eq. 8), as the code's -wd flag: 10 for MNIST/CIFAR-10, 1000 for CIFAR-100, "
        "2000 for Tiny-ImageNet (P-ICCV §5.1).",
    )
    fidelity: Literal["code", "paper"] = documented(
        "code", "code: the loss adds 0.5·λ·R, as both versions of the authors' code do; paper: λ·R, as P-ICCV Eq. 8."
    )
    variant: Literal["wdr", "dist", "no_wdr"] = documented(
        "wdr",
        'wdr: p̃ from the output layer plus WDR; the server never sees p_i or n_ij. dist ("w/ Dist.", P-arXiv '
        "Tab. 1): the true p_i drives aggregation and personalisation and there is no WDR; clients then send their "
        'label counts, which the privacy-preserving method avoids. no_wdr ("w/o WDR"): p̃ without the regulariser.',
    )
    classwise_blocks: int = documented(
        1,
        'How many of the model\'s last top-level blocks are class-wise: 1 = "cwFedAvg (Output)" (P-ICCV default), '
        "2 = FC+Output, 3 = Conv2+FC+Output, 0 = the whole model. The rest goes through FedAvg.",
    )
    classwise_layers: tuple[str, ...] = documented(
        (),
        'The class-wise blocks by name, e.g. ["last_feat", "fc"] for FC+Output; they must be the model\'s last '
        "blocks. Overrides classwise_blocks when given.",
    )
    p_source: Literal["partition", "train"] = documented(
        "partition",
        "Where p_i comes from: the client's whole partition before the 75/25 split (as the authors' code computes "
        "it) or its training split only.",
    )

    def __post_init__(self) -> None:
        check_real(_PATH + "wdr_lambda", self.wdr_lambda, low=0)
        check_choice(_PATH + "fidelity", self.fidelity, ("code", "paper"))
        check_choice(_PATH + "variant", self.variant, tuple(_VARIANT_LABELS))
        check_choice(_PATH + "p_source", self.p_source, ("partition", "train"))
        check_int(_PATH + "classwise_blocks", self.classwise_blocks, low=0)

    def classwise_count(self, blocks: tuple[str, ...]) -> int:
        """How many trailing blocks of a model with ``blocks`` are class-wise (0 = all).

        Resolves ``classwise_layers`` by name; a name that is not a block of the model, or
        names that are not its last blocks, raise ConfigError listing the model's blocks.
        """
        names = tuple(self.classwise_layers)
        if not names:
            return self.classwise_blocks
        for name in names:
            if name not in blocks:
                raise ConfigError(
                    f"algorithm.params.classwise_layers names {name!r}, which is not a top-level block of the "
                    f"model{closest(name, blocks)}; the model's blocks are: {', '.join(blocks)}"
                )
        if set(names) != set(blocks[-len(names) :]):
            raise ConfigError(
                f"algorithm.params.classwise_layers={list(names)!r} must be the model's last blocks "
                f"(class-wise layers sit on top of the FedAvg ones, P-ICCV §4.3); the model's blocks are: "
                f"{', '.join(blocks)}, so e.g. {list(blocks[-len(names) :])!r}"
            )
        return len(names)

    @property
    def wdr_coefficient(self) -> float:
        """c in loss = CE + c·R: 0.5·λ (code) or λ (paper) with WDR, else 0."""
        if self.variant != "wdr":
            return 0.0
        return (0.5 if self.fidelity == "code" else 1.0) * float(self.wdr_lambda)

    def label(self) -> str:
        """The method's name in figures and tables, as the papers write it.

        >>> CwFedAvgParams().label(), CwFedAvgParams(variant="no_wdr", classwise_layers=("conv2", "fc")).label()
        ('cwFedAvg (Output)', 'cwFedAvg w/o WDR (conv2+fc)')
        >>> CwFedAvgParams(classwise_blocks=4).label()
        'cwFedAvg (last 4 blocks)'
        """
        if self.classwise_layers:
            layers = "+".join(self.classwise_layers)
        else:
            layers = _BLOCK_LABELS.get(self.classwise_blocks, f"last {self.classwise_blocks} blocks")
        return f"cwFedAvg{_VARIANT_LABELS[self.variant]} ({layers})"


@dataclass(frozen=True)
class ModelParts:
    """Where the class-wise part, the FedAvg part and the output weight lie in the flat vector."""

    classwise: slice
    shared: tuple[slice, ...]
    """The FedAvg part: the parameters outside ``classwise`` (empty in all-layer mode)."""
    output_weight: slice
    output_shape: tuple[int, int]
    """(K, h) of the output layer's weight matrix W."""
    output_index: int
    """Index of W among the model's parameter tensors (``FlatModel.params``)."""

    @property
    def shared_size(self) -> int:
        return sum(s.stop - s.start for s in self.shared)

    def gather_shared(self, vector: np.ndarray) -> np.ndarray:
        return np.concatenate([vector[s] for s in self.shared]) if self.shared else vector[:0]


def model_parts(spec: ProblemSpec, architecture: str, params: CwFedAvgParams) -> ModelParts:
    """Split ``architecture``'s parameters into the class-wise blocks and the FedAvg rest (P-ICCV §4.3).

    Raises ConfigError naming ``algorithm.params.classwise_blocks`` (or ``classwise_layers``) if
    the model has fewer blocks or lacks a named one, or if its output layer does not have one
    row per class.
    """
    layout, blocks = spec.layouts[architecture], spec.blocks[architecture]
    classwise_blocks = params.classwise_count(tuple(blocks))
    if classwise_blocks > len(blocks):
        fail(
            _PATH + "classwise_blocks",
            classwise_blocks,
            f"between 0 (all layers) and {len(blocks)}, the number of top-level blocks of model "
            f"{architecture!r} ({', '.join(blocks)})",
        )
    classwise = trailing_blocks(layout, blocks, classwise_blocks)  # the body/head methods' block slicing
    shared = tuple(s for s in (slice(0, classwise.start), slice(classwise.stop, layout.size)) if s.stop > s.start)
    name = f"{spec.output_layer[architecture]}.weight"
    index = layout.names.index(name)
    shape = layout.shapes[index]
    if len(shape) != 2 or shape[0] != spec.num_classes:
        raise ConfigError(
            f"cwFedAvg needs an output layer with one weight row per class, but {name} of model "
            f"{architecture!r} has shape {shape} for {spec.num_classes} classes"
        )
    return ModelParts(classwise, shared, layout.index(name), (shape[0], shape[1]), index)
