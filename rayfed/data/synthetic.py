"""The offline default dataset: seeded, procedurally drawn "glyphs" in numpy.

It serves the quick start and the tests, where MNIST/CIFAR cannot be downloaded.
It is built to be *learnable but not trivial*, so that personalisation has something
to show: the 4-layer CNN of the cwFedAvg papers learns the 10-class task only from many
samples, while a 2-class subset (what a pathologically partitioned client sees) is easy.

How a sample is drawn
---------------------
* Every class has a prototype made of ``_PARTS_PER_CLASS`` strokes (anisotropic
  Gaussians with a centre, a length, a width and an angle).
* Classes come in confusable pairs (m, m + K//2) that share ``_SHARED_PARTS`` of their
  strokes, the way "3"/"8" or "shirt"/"T-shirt" share shapes; only the other strokes
  tell the pair apart. The pairs are deliberately not (2m, 2m+1): the pathological
  partitioner hands exactly those pairs to the same clients, which should see an easy
  local task while the global 10-class task stays hard.
* Each sample moves the whole glyph (translation, small rotation and scale), jitters
  every stroke's position and amplitude, sometimes drops a stroke, adds distractor
  strokes at random places, adds pixel noise, and is quantised to uint8.

Rendering is vectorised over chunks of samples (one ``exp`` over a
(chunk, strokes, pixels) array) and chunks run on a small thread pool, which helps
because numpy releases the GIL inside ufuncs. Every chunk has its own seed from
``numpy.random.SeedSequence(seed).spawn``, so the bytes depend only on the seed and the
options, not on the number of threads. A progress bar over the samples appears when the
generation takes more than a few seconds (:mod:`rayfed.util.progress`).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rayfed.data.dataset import ArrayDataset
from rayfed.data.registry import DATASETS
from rayfed.util.progress import progress_bar
from rayfed.util.validation import check, check_int, is_int

__all__ = ["check_synthetic", "load_synthetic", "make_synthetic"]

_PARTS_PER_CLASS = 4
_SHARED_PARTS = 2
_DISTRACTORS = 2
_BASE = 28.0  # geometry is designed on a 28x28 canvas and scaled to image_size
_FLOATS_PER_CHUNK = 1 << 23  # bounds one (chunk, strokes, pixels) float32 array to 32 MB

# Per-sample variation (units: pixels of the 28-grid, radians, fractions of full scale).
_STROKE_LENGTH = (1.6, 4.5)
_STROKE_WIDTH = (1.2, 2.0)
_PART_JITTER = 0.5
_ANGLE_JITTER = 0.15
_ROTATION = 0.2
_ZOOM = (0.85, 1.15)
_SHIFT = 2.0
_AMPLITUDE = (0.7, 1.0)
_DROP_PROB = 0.03
_DISTRACTOR_AMPLITUDE = (0.2, 0.5)
_NOISE = 0.06

_IMAGE_SIZES = (28, 32, 64)
_CHANNELS = (1, 3)
_MAX_CLASSES = 100
_OPTIONS = "data.options"  # where a config sets these values


def _random_strokes(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` strokes as rows (cx, cy, sigma_long, sigma_wide, angle) on the 28-grid."""
    strokes = np.empty((n, 5))
    strokes[:, 0:2] = rng.uniform(8.0, 20.0, size=(n, 2))
    strokes[:, 2] = rng.uniform(*_STROKE_LENGTH, size=n)
    strokes[:, 3] = rng.uniform(*_STROKE_WIDTH, size=n)
    strokes[:, 4] = rng.uniform(0.0, np.pi, size=n)
    return strokes


def _prototypes(rng: np.random.Generator, num_classes: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Class prototypes: strokes (K, P, 5) and stroke colours (K, P, C).

    Class m + K//2 copies the first ``_SHARED_PARTS`` strokes (and colours) of class m.
    """
    strokes = _random_strokes(rng, num_classes * _PARTS_PER_CLASS).reshape(num_classes, _PARTS_PER_CLASS, 5)
    colours = rng.uniform(0.35, 1.0, size=(num_classes, _PARTS_PER_CLASS, channels))
    if channels == 1:
        colours[:] = 1.0
    half = num_classes // 2
    second = np.arange(half, 2 * half)  # class half+m copies the shared strokes of class m
    strokes[second, :_SHARED_PARTS] = strokes[second - half, :_SHARED_PARTS]
    colours[second, :_SHARED_PARTS] = colours[second - half, :_SHARED_PARTS]
    return strokes, colours


def _render_chunk(
    rng: np.random.Generator,
    labels: np.ndarray,
    strokes: np.ndarray,
    colours: np.ndarray,
    image_size: int,
    out: np.ndarray,
) -> None:
    """Draw ``len(labels)`` samples into ``out`` (uint8, (B, C, S, S))."""
    b = len(labels)
    channels = colours.shape[2]
    scale = image_size / _BASE
    centre = _BASE / 2.0

    # Class strokes, moved per sample: jitter, then a global rotation/scale/translation.
    s = strokes[labels].copy()  # (B, P, 5)
    s[:, :, 0:2] += rng.normal(0.0, _PART_JITTER, size=(b, _PARTS_PER_CLASS, 2))
    s[:, :, 4] += rng.normal(0.0, _ANGLE_JITTER, size=(b, _PARTS_PER_CLASS))
    rot = rng.uniform(-_ROTATION, _ROTATION, size=(b, 1))
    zoom = rng.uniform(*_ZOOM, size=(b, 1))
    shift = rng.uniform(-_SHIFT, _SHIFT, size=(b, 1, 2))
    x, y = s[:, :, 0] - centre, s[:, :, 1] - centre
    cos, sin = np.cos(rot), np.sin(rot)
    s[:, :, 0] = zoom * (cos * x - sin * y) + centre
    s[:, :, 1] = zoom * (sin * x + cos * y) + centre
    s[:, :, 0:2] += shift
    s[:, :, 2:4] *= zoom[:, :, None]
    s[:, :, 4] += rot
    amp = rng.uniform(*_AMPLITUDE, size=(b, _PARTS_PER_CLASS))
    amp *= rng.random(size=(b, _PARTS_PER_CLASS)) >= _DROP_PROB  # a stroke goes missing
    col = colours[labels] * rng.uniform(0.8, 1.2, size=(b, _PARTS_PER_CLASS, channels))

    # Distractor strokes anywhere on the canvas, in any colour.
    d = _random_strokes(rng, b * _DISTRACTORS).reshape(b, _DISTRACTORS, 5)
    d[:, :, 0:2] = rng.uniform(3.0, _BASE - 3.0, size=(b, _DISTRACTORS, 2))
    d_amp = rng.uniform(*_DISTRACTOR_AMPLITUDE, size=(b, _DISTRACTORS))
    d_col = rng.uniform(0.35, 1.0, size=(b, _DISTRACTORS, channels)) if channels > 1 else np.ones((b, _DISTRACTORS, 1))

    allp = np.concatenate([s, d], axis=1).astype(np.float32)  # (B, Q, 5)
    amplitudes = np.concatenate([amp, d_amp], axis=1)[:, :, None]
    weights = (amplitudes * np.concatenate([col, d_col], axis=1)).astype(np.float32)  # (B, Q, C)

    # Quadratic form of a rotated Gaussian, evaluated on the pixel grid (pixel centres).
    grid = (np.arange(image_size, dtype=np.float32) + 0.5) / np.float32(scale)
    cx, cy = allp[:, :, 0:1], allp[:, :, 1:2]
    inv_l, inv_w = 1.0 / allp[:, :, 2:3] ** 2, 1.0 / allp[:, :, 3:4] ** 2
    ct, st = np.cos(allp[:, :, 4:5]), np.sin(allp[:, :, 4:5])
    qa = -0.5 * (ct * ct * inv_l + st * st * inv_w)  # coefficient of dx^2
    qb = -(ct * st) * (inv_l - inv_w)  # coefficient of dx*dy
    qc = -0.5 * (st * st * inv_l + ct * ct * inv_w)  # coefficient of dy^2
    dx = grid[None, None, :] - cx  # (B, Q, S)
    dy = grid[None, None, :] - cy
    field = (qc * dy * dy)[:, :, :, None] + (qb * dy)[:, :, :, None] * dx[:, :, None, :]
    field += (qa * dx * dx)[:, :, None, :]
    np.exp(field, out=field)  # (B, Q, S, S)
    pix = weights.transpose(0, 2, 1) @ field.reshape(b, allp.shape[1], -1)  # (B, C, S*S)
    pix += rng.normal(0.0, _NOISE, size=pix.shape).astype(np.float32)
    np.clip(pix, 0.0, 1.0, out=pix)
    out[:] = (pix * 255.0 + 0.5).astype(np.uint8).reshape(out.shape)


def check_synthetic(num_samples: int, num_classes: int, channels: int, image_size: int) -> int:
    """Check the options (naming ``data.options.*``) and return the bytes generation needs beyond the dataset.

    Those are the labels' temporaries and, per rendering thread, the (chunk, strokes,
    pixels) float32 arrays of one chunk; the engine's memory estimate
    (:mod:`rayfed.engine.sizing`) counts them without generating anything.
    """
    check_int(f"{_OPTIONS}.num_samples", num_samples, low=1)
    check_int(f"{_OPTIONS}.num_classes", num_classes, low=2, high=_MAX_CLASSES)
    for option, value, allowed in (("channels", channels, _CHANNELS), ("image_size", image_size, _IMAGE_SIZES)):
        check(is_int(value) and value in allowed, f"{_OPTIONS}.{option}", value, f"one of {allowed}")
    return 2 * 8 * num_samples + _threads(None) * 3 * 4 * _FLOATS_PER_CHUNK


def _threads(num_threads: int | None) -> int:
    return num_threads or min(4, os.cpu_count() or 1)


def make_synthetic(
    seed: int = 0,
    *,
    num_samples: int = 70_000,
    num_classes: int = 10,
    channels: int = 1,
    image_size: int = 28,
    num_threads: int | None = None,
) -> ArrayDataset:
    """Generate the synthetic glyph dataset (see the module docstring).

    Parameters
    ----------
    seed
        Same seed and options give identical bytes.
    num_samples
        N; labels are balanced (each class gets N // K or N // K + 1 samples) and
        shuffled. The default 70,000 matches the merged MNIST pool.
    num_classes
        K, from 2 to 100.
    channels
        1 (MNIST-like) or 3 (a CIFAR / Tiny-ImageNet stand-in).
    image_size
        28, 32 or 64.
    num_threads
        Threads that render chunks; ``None`` uses up to 4 (or the CPU count). Does not
        change the result.

    Examples
    --------
    >>> ds = make_synthetic(0, num_samples=20, channels=3, image_size=32)
    >>> ds.images.shape, ds.images.dtype.name
    ((20, 3, 32, 32), 'uint8')
    """
    check_synthetic(num_samples, num_classes, channels, image_size)
    seq_proto, seq_labels, seq_chunks = np.random.SeedSequence(seed).spawn(3)
    strokes, colours = _prototypes(np.random.default_rng(seq_proto), num_classes, channels)
    labels = np.random.default_rng(seq_labels).permutation(np.arange(num_samples, dtype=np.int64) % num_classes)

    images = np.empty((num_samples, channels, image_size, image_size), dtype=np.uint8)
    chunk = max(1, _FLOATS_PER_CHUNK // ((_PARTS_PER_CLASS + _DISTRACTORS) * image_size * image_size))
    starts = range(0, num_samples, chunk)
    chunk_seqs = seq_chunks.spawn(len(starts))

    def render(i: int) -> int:
        lo = starts[i]
        hi = min(lo + chunk, num_samples)
        _render_chunk(np.random.default_rng(chunk_seqs[i]), labels[lo:hi], strokes, colours, image_size, images[lo:hi])
        return hi - lo

    workers = _threads(num_threads)
    with progress_bar(num_samples, "generating synthetic samples", "sample") as bar:
        if workers == 1 or len(starts) == 1:
            for i in range(len(starts)):
                bar.update(render(i))
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for done in pool.map(render, range(len(starts))):
                    bar.update(done)
    return ArrayDataset(
        name="synthetic",
        inputs=images,
        labels=labels,
        num_classes=num_classes,
        mean=(0.5,) * channels,
        std=(0.5,) * channels,
    )


@DATASETS.register("synthetic")
def load_synthetic(
    root: str | None,
    *,
    download: bool = False,
    seed: int = 0,
    num_samples: int = 70_000,
    num_classes: int = 10,
    channels: int = 1,
    image_size: int = 28,
) -> ArrayDataset:
    """Registry entry for ``data.dataset="synthetic"``; ``root`` and ``download`` are unused."""
    del root, download
    return make_synthetic(
        seed, num_samples=num_samples, num_classes=num_classes, channels=channels, image_size=image_size
    )
