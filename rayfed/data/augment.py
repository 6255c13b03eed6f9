"""Batched random image augmentation on the worker, with per-sample randomness.

The SimCLR / SupCon training pipeline that FedClassAvg applies twice per image, giving
the two views x' and x'' of its local objective ("FedClassAvg: Local Representation
Learning for Personalized Federated Learning on Heterogeneous Neural Networks", ICPP
2022, Sec. 3.2, Eq. 4). The paper does not list the transforms; these are the authors'
code's torchvision ones (docs/algorithms.md, FedClassAvg section)::

    RandomResizedCrop(size, scale=(0.2, 1)) -> RandomHorizontalFlip()
    -> RandomApply([ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8) -> RandomGrayscale(p=0.2)

Here it runs on a whole batch of tensors at once: every sample draws its own crop box,
flip, jitter factors, jitter order and grayscale coin from one ``torch.Generator``, so a
client's views depend only on its seed, never on the worker that computes them.

Inputs are *normalised* batches, ``(x - mean) / std`` as :func:`normalize_batch` makes
them. :func:`augment_batch` maps them back to [0, 1] pixel space first (the colour
operations clamp to [0, 1] there, as torchvision's do), augments, and normalises again.

How it relates to torchvision's per-image pipeline:

* crop and resize are one bilinear sampling of the crop box (``grid_sample``); it
  equals torchvision's ``resized_crop`` on tensors up to float rounding;
* for 1-channel images only brightness and contrast apply. Saturation, hue and
  grayscale leave a single-channel image unchanged in torchvision (and in PIL's "L"
  mode, which the authors' MNIST-family loaders use), so they are skipped. Their random
  numbers are still drawn, so the stream does not depend on the channel count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "AugmentConfig",
    "SIMCLR_AUGMENT",
    "AUGMENT_DRAWS",
    "augment_batch",
    "draw_augment",
    "apply_augment",
    "pixel_scale",
    "random_resized_crop_boxes",
    "rgb_to_hsv",
    "hsv_to_rgb",
]

_GRAY_WEIGHTS = (0.2989, 0.587, 0.114)
"""ITU-R 601-2 luma, as torchvision's ``rgb_to_grayscale``."""

_CROP_ATTEMPTS = 10


@dataclass(frozen=True)
class AugmentConfig:
    """Parameters of the pipeline; the defaults are the authors' (SupCon's) values."""

    crop_scale: tuple[float, float] = (0.2, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    jitter_p: float = 0.8
    grayscale_p: float = 0.2


SIMCLR_AUGMENT = AugmentConfig()


AUGMENT_DRAWS = 15
"""Random numbers one sample's augmentation draws, as :func:`draw_augment` packs them: the crop box (top, left,
height, width), the flip and jitter coins, the four jitter factors, the jitter order (4) and the grayscale coin."""


def augment_batch(
    x: torch.Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    generator: torch.Generator,
    config: AugmentConfig = SIMCLR_AUGMENT,
) -> torch.Tensor:
    """One random view of every image in a normalised batch ``x`` (B, C, H, W); a new tensor.

    Random numbers come from ``generator`` (a CPU generator; they are moved to ``x``'s
    device), a fixed number per sample, in a fixed order (:func:`draw_augment`, then
    :func:`apply_augment`).

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.zeros(4, 1, 28, 28)
    >>> augment_batch(x, (0.5,), (0.5,), g).shape
    torch.Size([4, 1, 28, 28])
    """
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"augment_batch expects a (B, 1 or 3, H, W) batch, but got shape={tuple(x.shape)}")
    draws = draw_augment(x.shape[0], x.shape[2], x.shape[3], generator, config).to(x.device, non_blocking=True)
    return apply_augment(x, draws, *pixel_scale(mean, std, x), config)


def pixel_scale(mean: Sequence[float], std: Sequence[float], like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalisation's mean and std as (1, C, 1, 1) tensors of ``like``'s dtype and device."""
    shape = (1, -1, 1, 1)
    return (
        torch.as_tensor(mean, dtype=like.dtype).view(shape).to(like.device, non_blocking=True),
        torch.as_tensor(std, dtype=like.dtype).view(shape).to(like.device, non_blocking=True),
    )


def draw_augment(
    n: int, height: int, width: int, generator: torch.Generator, config: AugmentConfig = SIMCLR_AUGMENT
) -> torch.Tensor:
    """The random numbers of ``n`` samples' augmentations, (n, :data:`AUGMENT_DRAWS`) float64 on the CPU, drawn
    from ``generator`` in a fixed order: a batch's draws depend on its size and the generator's state only."""
    top, left, box_h, box_w = random_resized_crop_boxes(
        n, height, width, config.crop_scale, config.crop_ratio, generator
    )
    flip = torch.rand(n, generator=generator) < config.flip_p
    jitter = torch.rand(n, generator=generator) < config.jitter_p
    factors = _jitter_factors(n, config, generator)
    order = torch.argsort(torch.rand(n, 4, generator=generator), dim=1)
    gray = torch.rand(n, generator=generator) < config.grayscale_p
    columns = [top, left, box_h, box_w, flip, jitter, *factors.unbind(1), *order.unbind(1), gray]
    return torch.stack([c.to(torch.float64) for c in columns], dim=1)


def apply_augment(
    x: torch.Tensor,
    draws: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    config: AugmentConfig = SIMCLR_AUGMENT,
) -> torch.Tensor:
    """The views of a normalised batch ``x`` (B, C, H, W) that ``draws`` (B, :data:`AUGMENT_DRAWS`, on ``x``'s
    device) describe; ``mean`` and ``std`` as :func:`pixel_scale` gives them. Nothing is read back to the host,
    so a captured training step can augment its batch."""
    channels = x.shape[1]
    top, left, box_h, box_w = (draws[:, i].long() for i in range(4))
    flip, jitter, gray = draws[:, 4] > 0.5, draws[:, 5] > 0.5, draws[:, 14] > 0.5
    factors, order = draws[:, 6:10].to(torch.float32), draws[:, 10:14].long()
    pixels = x * std + mean
    pixels = _crop_flip_resize(pixels, top, left, box_h, box_w, flip)
    pixels = _color_jitter(pixels, jitter, factors, order)
    if channels == 3:
        pixels = torch.where(gray.view(-1, 1, 1, 1), _grayscale(pixels).expand_as(pixels), pixels)
    return (pixels - mean) / std


def random_resized_crop_boxes(
    n: int,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Crop boxes ``(top, left, h, w)`` (int64, one per sample) as ``RandomResizedCrop.get_params`` draws them.

    Each sample tries up to 10 (area, log-aspect) draws and keeps the first box that fits;
    a sample with none falls back to the largest central box of clamped aspect ratio.
    All 10 draws are made for every sample, so the stream has a fixed length.
    """
    area = float(height * width)
    u_area = torch.rand(n, _CROP_ATTEMPTS, generator=generator, dtype=torch.float64)
    u_ratio = torch.rand(n, _CROP_ATTEMPTS, generator=generator, dtype=torch.float64)
    u_top = torch.rand(n, generator=generator, dtype=torch.float64)
    u_left = torch.rand(n, generator=generator, dtype=torch.float64)
    target = area * (scale[0] + (scale[1] - scale[0]) * u_area)
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * u_ratio)
    w = torch.round(torch.sqrt(target * aspect)).long()
    h = torch.round(torch.sqrt(target / aspect)).long()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.argmax(fits.to(torch.int8), dim=1, keepdim=True)  # index of the first True (0 if none)
    any_fit = fits.any(dim=1)
    box_w = torch.where(any_fit, w.gather(1, first).squeeze(1), torch.tensor(0))
    box_h = torch.where(any_fit, h.gather(1, first).squeeze(1), torch.tensor(0))
    fallback_h, fallback_w = _central_box(height, width, ratio)
    box_w = torch.where(any_fit, box_w, torch.tensor(fallback_w))
    box_h = torch.where(any_fit, box_h, torch.tensor(fallback_h))
    top = torch.where(any_fit, torch.floor(u_top * (height - box_h + 1)).long(), (height - box_h) // 2)
    left = torch.where(any_fit, torch.floor(u_left * (width - box_w + 1)).long(), (width - box_w) // 2)
    return top, left, box_h, box_w


def _central_box(height: int, width: int, ratio: tuple[float, float]) -> tuple[int, int]:
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        return int(round(w / min(ratio))), w
    if in_ratio > max(ratio):
        h = height
        return h, int(round(h * max(ratio)))
    return height, width


def _crop_flip_resize(
    pixels: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    box_h: torch.Tensor,
    box_w: torch.Tensor,
    flip: torch.Tensor,
) -> torch.Tensor:
    """Bilinear resize of each sample's box to the full size, mirrored where ``flip``.

    Output pixel u samples the source at x = left + (u + 0.5)·w/W − 0.5, clamped to the
    box (``interpolate(..., align_corners=False)`` on the cropped image does the same), so
    the result equals torchvision's ``resized_crop`` without antialiasing (and with it, as
    the box is never larger than the output).
    """
    n, _, height, width = pixels.shape
    dtype = pixels.dtype
    gx = _source_coords(left, box_w, width, dtype)  # (n, W)
    gy = _source_coords(top, box_h, height, dtype)  # (n, H)
    gx = torch.where(flip.view(-1, 1), gx.flip(1), gx)
    grid_x = gx.view(n, 1, width).expand(-1, height, -1)
    grid_y = gy.view(n, height, 1).expand(-1, -1, width)
    grid = torch.stack([grid_x, grid_y], dim=3)
    return F.grid_sample(pixels, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _source_coords(start: torch.Tensor, size: torch.Tensor, out: int, dtype: torch.dtype) -> torch.Tensor:
    """Normalised (align_corners=False) source coordinates of ``out`` pixels resampling [start, start + size)."""
    u = torch.arange(out, dtype=dtype, device=start.device).view(1, -1)
    start_f, size_f = start.to(dtype).view(-1, 1), size.to(dtype).view(-1, 1)
    src = start_f + (u + 0.5) * size_f / out - 0.5
    src = torch.minimum(torch.maximum(src, start_f), start_f + size_f - 1)
    return (2 * src + 1) / out - 1


def _jitter_factors(n: int, config: AugmentConfig, generator: torch.Generator) -> torch.Tensor:
    """(n, 4): brightness, contrast, saturation factors in [max(0, 1 − s), 1 + s]; hue shift in [−h, h]."""
    u = torch.rand(n, 4, generator=generator)
    lows, highs = [], []
    for strength in (config.brightness, config.contrast, config.saturation):
        lows.append(max(0.0, 1.0 - strength))
        highs.append(1.0 + strength)
    lows.append(-config.hue)
    highs.append(config.hue)
    low = torch.tensor(lows)
    return low + (torch.tensor(highs) - low) * u


def _color_jitter(
    pixels: torch.Tensor, apply: torch.Tensor, factors: torch.Tensor, order: torch.Tensor
) -> torch.Tensor:
    """ColorJitter with a per-sample random order of its four operations, on samples where ``apply``.

    Each operation runs on the whole batch and is kept where a sample applies it at that position, so no
    shape depends on the draws (an operation acts on each image alone, so the kept values are those of
    running it on the applying samples only)."""
    single = pixels.shape[1] == 1
    out = pixels
    for position in range(4):
        for op in range(4):
            if single and op >= 2:  # saturation and hue leave 1-channel images unchanged
                continue
            chosen = (apply & (order[:, position] == op)).view(-1, 1, 1, 1)
            out = torch.where(chosen, _jitter_op(op, out, factors[:, op].view(-1, 1, 1, 1)), out)
    return out


def _jitter_op(op: int, img: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    if op == 0:  # brightness: blend with black
        return (img * factor).clamp_(0.0, 1.0)
    if op == 1:  # contrast: blend with the mean grey level of the image
        grey = _grayscale(img).mean(dim=(1, 2, 3), keepdim=True)
        return (img * factor + grey * (1 - factor)).clamp_(0.0, 1.0)
    if op == 2:  # saturation: blend with the image's grayscale version
        return (img * factor + _grayscale(img) * (1 - factor)).clamp_(0.0, 1.0)
    hsv = rgb_to_hsv(img)
    hue = torch.remainder(hsv[:, :1] + factor, 1.0)
    return hsv_to_rgb(torch.cat([hue, hsv[:, 1:]], dim=1))


def _grayscale(img: torch.Tensor) -> torch.Tensor:
    """(N, 1, H, W) luma of an RGB batch; a 1-channel batch is its own luma."""
    if img.shape[1] == 1:
        return img
    r, g, b = img.unbind(dim=1)
    return (_GRAY_WEIGHTS[0] * r + _GRAY_WEIGHTS[1] * g + _GRAY_WEIGHTS[2] * b).unsqueeze(1)


def rgb_to_hsv(img: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) RGB in [0, 1] to HSV with hue in [0, 1)."""
    r, g, b = img.unbind(dim=1)
    value, argmax = img.max(dim=1)
    chroma = value - img.min(dim=1).values
    grey = chroma == 0
    safe_chroma = torch.where(grey, torch.ones_like(chroma), chroma)
    positive = value > 0
    saturation = torch.where(positive, chroma / torch.where(positive, value, torch.ones_like(value)), 0.0)
    # Hue sector by the dominant channel (ties resolved R, then G, then B).
    hue_r = (g - b) / safe_chroma
    hue_g = 2.0 + (b - r) / safe_chroma
    hue_b = 4.0 + (r - g) / safe_chroma
    hue = torch.where(argmax == 0, hue_r, torch.where(argmax == 1, hue_g, hue_b))
    hue = torch.remainder(hue / 6.0, 1.0)
    hue = torch.where(grey, torch.zeros_like(hue), hue)
    return torch.stack([hue, saturation, value], dim=1)


# For sector i = floor(6h) the (R, G, B) channels take these of the candidates (v, t, p, q).
_SECTOR_SOURCES = torch.tensor(
    [
        [0, 3, 2, 2, 1, 0],  # R
        [1, 0, 0, 3, 2, 2],  # G
        [2, 2, 1, 0, 0, 3],  # B
    ]
)


_SOURCES_ON: dict[torch.device, torch.Tensor] = {}


def _sector_sources(device: torch.device) -> torch.Tensor:
    """:data:`_SECTOR_SOURCES` on ``device``, moved there once."""
    if device not in _SOURCES_ON:
        _SOURCES_ON[device] = _SECTOR_SOURCES.to(device)
    return _SOURCES_ON[device]


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`rgb_to_hsv`."""
    hue, sat, value = hsv.unbind(dim=1)
    scaled = hue * 6.0
    sector = torch.floor(scaled)
    frac = scaled - sector
    sector = sector.long().remainder(6)
    p = (value * (1 - sat)).clamp(0.0, 1.0)
    q = (value * (1 - sat * frac)).clamp(0.0, 1.0)
    t = (value * (1 - sat * (1 - frac))).clamp(0.0, 1.0)
    candidates = torch.stack([value, t, p, q], dim=1)  # (N, 4, H, W)
    sources = _sector_sources(hsv.device)[:, sector]  # (3, N, H, W)
    return torch.gather(candidates, 1, sources.permute(1, 0, 2, 3))
