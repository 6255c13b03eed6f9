"""The model registry and the shape checks shared by every model module.

A model module declares one :class:`ModelSpec` per architecture and passes it to
:func:`register_model`; ``rayfed.models.build_model`` looks it up by name.
This module imports nothing from the model modules, so they can import it freely.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from rayfed.util.errors import ConfigError
from rayfed.util.registry import Registry, caller_module

__all__ = [
    "InputShape",
    "ModelSpec",
    "input_kind",
    "MODELS",
    "register_model",
    "min_side_reason",
    "ensure_supported",
]

InputShape = tuple[int, ...]
"""One sample's input shape, without the batch dimension: ``(C, H, W)`` for an image, ``(L, V)``
for a sequence of L token ids from a vocabulary of V tokens (the shape of its one-hot form)."""


def input_kind(input_shape: InputShape) -> str:
    """``"image"`` for a (C, H, W) shape, ``"tokens"`` for an (L, V) one, ``""`` otherwise.

    >>> input_kind((1, 28, 28)), input_kind((200, 32000))
    ('image', 'tokens')
    """
    return {3: "image", 2: "tokens"}.get(len(input_shape), "")


@dataclass(frozen=True)
class ModelSpec:
    """One registered architecture.

    Parameters
    ----------
    name
        The registry key, i.e. the value of the config field ``model.name``.
    factory
        ``(input_shape, num_classes) -> nn.Module``. It must draw random numbers only
        from torch's global generator (parameter initialisation), so that
        ``torch.manual_seed(s)`` before the call fixes the parameters.
    supports
        ``input_shape -> None`` when the architecture fits that input, else a sentence
        that says why not and which shapes are allowed.
    description
        One line naming the architecture and its source, used in error messages.
    input_kind
        The inputs it takes: ``"image"`` (C, H, W) or ``"tokens"`` (L, V) (:func:`input_kind`).
        ``supports`` is only asked about shapes of this kind.
    unstackable
        Why clients of this architecture cannot train stacked (:mod:`rayfed.train.stacked`), or "" when they
        can: a stack holds client c's channels at c·channels, so a forward that concatenates, splits or
        shuffles channels mixes clients. Declared here, as no layer shows it.
    """

    name: str
    factory: Callable[[InputShape, int], nn.Module]
    supports: Callable[[InputShape], str | None]
    description: str
    input_kind: str = "image"
    unstackable: str = ""


MODELS: Registry[ModelSpec] = Registry("model", field="model.name")


def register_model(spec: ModelSpec) -> ModelSpec:
    """Register ``spec`` under ``spec.name`` and return it."""
    return MODELS.register(spec.name, origin=caller_module())(spec)


def min_side_reason(input_shape: InputShape, min_px: int, why: str) -> str | None:
    """Return ``None`` if both H and W are at least ``min_px``, else the reason.

    >>> min_side_reason((1, 28, 28), 16, "two 5x5 convs and two 2x2 pools") is None
    True
    >>> min_side_reason((1, 8, 8), 16, "two 5x5 convs and two 2x2 pools")
    'needs H and W >= 16 (two 5x5 convs and two 2x2 pools), got H=8, W=8'
    """
    _, height, width = input_shape
    if height >= min_px and width >= min_px:
        return None
    return f"needs H and W >= {min_px} ({why}), got H={height}, W={width}"


def ensure_supported(label: str, supports: Callable[[InputShape], str | None], input_shape: InputShape) -> None:
    """Raise ConfigError naming ``label`` if ``supports(input_shape)`` gives a reason.

    Model constructors call this so that building one by hand fails as clearly as
    ``build_model`` does.
    """
    reason = supports(input_shape)
    if reason is not None:
        raise ConfigError(f"{label} does not fit input_shape={tuple(input_shape)}: {reason}")
