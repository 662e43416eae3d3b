"""The torchvision.transforms stand-in: torchvision's documented sizes, crop boxes and values, on PIL images."""

import numpy as np
import pytest
import torch
from PIL import Image

from optimum_ipu.launcher.shims import torchvision_transforms as T


def image(width, height):
    """An RGB image whose pixel (y, x) holds (y, x, 7), so a crop's position can be read off its pixels."""
    array = np.zeros((height, width, 3), dtype=np.uint8)
    array[..., 0] = np.arange(height)[:, None]
    array[..., 1] = np.arange(width)[None, :]
    array[..., 2] = 7
    return Image.fromarray(array)


def test_to_tensor_is_channels_first_in_0_to_1():
    tensor = T.ToTensor()(image(3, 2))
    assert tensor.shape == (3, 2, 3) and tensor.dtype == torch.float32
    assert tensor[1, 1, 2].item() == pytest.approx(2 / 255) and tensor[2, 0, 0].item() == pytest.approx(
        7 / 255
    )


def test_normalize_per_channel():
    out = T.Normalize([0.5, 0.0, 1.0], [0.5, 2.0, 1.0])(torch.ones(3, 1, 1))
    assert out.flatten().tolist() == [1.0, 0.5, 0.0]


def test_resize_an_int_sizes_the_shorter_edge_a_pair_is_height_width():
    assert T.Resize(4)(image(10, 6)).size == (6, 4)  # short edge 6 -> 4, long edge int(4 * 10 / 6) = 6
    assert T.Resize(4)(image(6, 10)).size == (4, 6)
    assert T.Resize((5, 7))(image(10, 6)).size == (7, 5)


def test_center_crop_box_rounds_half_to_even_as_python_round():
    # 11 x 7 image, crop 4: top round(1.5) = 2, left round(3.5) = 4
    crop = np.array(T.CenterCrop(4)(image(11, 7)))
    assert crop[0, 0, :2].tolist() == [2, 4] and crop.shape == (4, 4, 3)


def test_center_crop_larger_than_the_image_pads_with_zeros():
    crop = np.array(T.CenterCrop(4)(image(2, 2)))
    assert crop.shape == (4, 4, 3)
    assert crop[0].sum() == 0 and crop[1, 1, 2] == 7 and crop[3].sum() == 0  # image at rows 1-2, columns 1-2


def test_random_resized_crop_of_the_whole_area_at_ratio_1_is_a_resize():
    source = image(8, 8)
    crop = T.RandomResizedCrop(4, scale=(1.0, 1.0), ratio=(1.0, 1.0))(source)
    assert np.array_equal(np.array(crop), np.array(source.resize((4, 4), Image.BILINEAR)))


def test_random_resized_crop_draws_from_torchs_generator():
    transform = T.RandomResizedCrop(4)
    torch.manual_seed(3)
    first = [transform.get_params(image(20, 12)) for _ in range(5)]
    torch.manual_seed(3)
    assert [transform.get_params(image(20, 12)) for _ in range(5)] == first
    for top, left, height, width in first:
        assert 0 <= top <= 12 - height and 0 <= left <= 20 - width
        assert 0.08 * 240 - 8 <= height * width <= 240  # scale (0.08, 1) of the area, up to rounding
    assert T.RandomResizedCrop(4)(image(20, 12)).size == (4, 4)


def test_horizontal_flip_with_probability():
    source = image(3, 2)
    assert np.array(T.RandomHorizontalFlip(p=1.0)(source))[0, 0, 1] == 2
    assert np.array(T.RandomHorizontalFlip(p=0.0)(source))[0, 0, 1] == 0


def test_compose_applies_in_order():
    out = T.Compose([T.Resize((2, 2)), T.ToTensor(), T.Lambda(lambda t: t.half())])(image(4, 4))
    assert out.shape == (3, 2, 2) and out.dtype == torch.float16
