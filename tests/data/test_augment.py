"""The batched SimCLR augmentation: torchvision's operations, per-sample randomness, seeding."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms.functional as TF

from rayfed.data.augment import (  # and two of its single operations
    AugmentConfig,
    _crop_flip_resize,
    _jitter_op,
    augment_batch,
    hsv_to_rgb,
    random_resized_crop_boxes,
    rgb_to_hsv,
)

MEAN, STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


def _images(n: int = 6, channels: int = 3, side: int = 32) -> torch.Tensor:
    return torch.rand(n, channels, side, side, generator=torch.Generator().manual_seed(1))


def test_crop_flip_resize_equals_torchvision_resized_crop() -> None:
    x = _images(1)
    box = [torch.tensor([v]) for v in (4, 6, 20, 16)]  # top, left, h, w
    expected = TF.resized_crop(x, 4, 6, 20, 16, [32, 32], antialias=True)
    torch.testing.assert_close(_crop_flip_resize(x, *box, torch.tensor([False])), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(_crop_flip_resize(x, *box, torch.tensor([True])), expected.flip(-1), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("op", "reference", "factor"),
    [
        (0, TF.adjust_brightness, 1.3),
        (1, TF.adjust_contrast, 0.7),
        (2, TF.adjust_saturation, 1.4),
        (3, TF.adjust_hue, -0.08),
    ],
)
def test_colour_operations_equal_torchvision(op, reference, factor) -> None:
    x = _images()
    expected = torch.stack([reference(image, factor) for image in x])
    torch.testing.assert_close(_jitter_op(op, x, torch.full((len(x), 1, 1, 1), factor)), expected, rtol=0, atol=2e-6)


def test_hsv_round_trip() -> None:
    x = _images()
    torch.testing.assert_close(hsv_to_rgb(rgb_to_hsv(x)), x, rtol=0, atol=1e-6)


def test_crop_boxes_stay_inside_the_image_and_cover_the_scale_range() -> None:
    generator = torch.Generator().manual_seed(0)
    top, left, h, w = random_resized_crop_boxes(5000, 28, 28, (0.2, 1.0), (3 / 4, 4 / 3), generator)
    assert int(top.min()) >= 0 and int(left.min()) >= 0
    assert int((top + h).max()) <= 28 and int((left + w).max()) <= 28
    area = (h * w).double() / 784
    assert 0.15 < float(area.min()) < 0.25 and float(area.max()) == 1.0


def test_views_are_per_sample_random_and_seeded() -> None:
    x = (_images(1).expand(8, -1, -1, -1) - 0.5) / 0.5  # eight copies of one image
    a = augment_batch(x, MEAN, STD, torch.Generator().manual_seed(3))
    b = augment_batch(x, MEAN, STD, torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert len({tuple(v.flatten()[:50].tolist()) for v in a}) == 8  # every copy got its own view
    assert float(a.min()) >= -1 - 1e-6 and float(a.max()) <= 1 + 1e-6  # still normalised [0, 1] pixels


def test_identity_config_returns_the_input() -> None:
    identity = AugmentConfig(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip_p=0.0, jitter_p=0.0, grayscale_p=0.0)
    x = (_images() - 0.5) / 0.5
    torch.testing.assert_close(augment_batch(x, MEAN, STD, torch.Generator(), identity), x, rtol=0, atol=1e-6)


def test_single_channel_images_get_brightness_and_contrast_only() -> None:
    x = (_images(64, channels=1, side=28) - 0.5) / 0.5
    only_colour = AugmentConfig(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip_p=0.0, jitter_p=1.0, grayscale_p=1.0)
    out = augment_batch(x, (0.5,), (0.5,), torch.Generator().manual_seed(0), only_colour)
    assert out.shape == x.shape and not torch.equal(out, x)
