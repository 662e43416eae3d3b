"""A stand-in for the part of `torchvision.transforms` that Optimum Graphcore's image examples use.

optimum-ipu does not depend on torchvision (where this project is built, no CPU wheel of it installs
without pulling CUDA packages), but `run_image_classification.py` and the image-classification
notebook import `Compose`, `Normalize`, `RandomHorizontalFlip`, `RandomResizedCrop`, `Resize`,
`CenterCrop` and `ToTensor` from it. When torchvision is not installed, the launcher provides
these (plus `Lambda`) for PIL images, with torchvision's documented behaviour: the same output
sizes and crop boxes, PIL's bilinear resampling (what torchvision uses on PIL images), and the
random choices drawn from torch's global generator in the same order, so a seeded run crops and
flips the same images.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image

__all__ = ["NAMES", "make_modules"]


def _pair(size) -> tuple[int, int]:
    """(height, width) from an int or a 1- or 2-sequence."""
    if isinstance(size, int):
        return size, size
    size = tuple(size)
    return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])


def _pil(image, transform: str) -> Image.Image:
    if not isinstance(image, Image.Image):
        raise TypeError(
            f"{transform} (optimum-ipu's stand-in for torchvision, which is not installed) takes PIL images, got "
            f"{type(image).__name__}; apply it before ToTensor, or install torchvision."
        )
    return image


class Compose:
    """Apply `transforms` in order."""

    def __init__(self, transforms: Sequence[Callable]):
        self.transforms = list(transforms)

    def __call__(self, image):
        for transform in self.transforms:
            image = transform(image)
        return image

    def __repr__(self) -> str:
        return "Compose(" + ", ".join(map(repr, self.transforms)) + ")"


class Lambda:
    """Apply a user function."""

    def __init__(self, function: Callable):
        self.function = function

    def __call__(self, image):
        return self.function(image)


class ToTensor:
    """PIL image / HxWxC array -> CxHxW tensor; 8-bit values are scaled to [0, 1] floats."""

    def __call__(self, image) -> torch.Tensor:
        array = np.array(image, copy=True)
        if isinstance(image, Image.Image) and image.mode == "1":
            array = array.astype(np.uint8) * 255
        if array.ndim == 2:
            array = array[:, :, None]
        tensor = torch.from_numpy(array).permute(2, 0, 1).contiguous()
        return tensor.float().div(255) if tensor.dtype == torch.uint8 else tensor


class Normalize:
    """(tensor - mean) / std per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False):
        self.mean, self.std, self.inplace = list(mean), list(std), inplace

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_floating_point():
            raise TypeError(f"Normalize expects a float tensor, got {tensor.dtype}.")
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype, device=tensor.device).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype, device=tensor.device).view(-1, 1, 1)
        if (std == 0).any():
            raise ValueError(f"Normalize: std {self.std} has a zero, which would divide by zero.")
        return (tensor.sub_(mean).div_(std)) if self.inplace else (tensor - mean) / std


class Resize:
    """To `size` (height, width); an int sizes the shorter edge and keeps the aspect ratio."""

    def __init__(self, size, interpolation=Image.BILINEAR, max_size=None, antialias=True):
        self.size, self.interpolation, self.max_size = size, interpolation, max_size

    def __call__(self, image) -> Image.Image:
        image = _pil(image, "Resize")
        width, height = image.size
        if isinstance(self.size, int) or len(self.size) == 1:
            requested = self.size if isinstance(self.size, int) else self.size[0]
            short, long = sorted((width, height))
            new_short, new_long = requested, int(requested * long / short)
            if self.max_size is not None and new_long > self.max_size:
                new_short, new_long = int(self.max_size * new_short / new_long), self.max_size
            new_width, new_height = (new_short, new_long) if width <= height else (new_long, new_short)
            if (new_width, new_height) == (width, height):
                return image
        else:
            new_height, new_width = _pair(self.size)
        return image.resize((new_width, new_height), self.interpolation)


class CenterCrop:
    """The central `size` crop (zero-padded first where the image is smaller)."""

    def __init__(self, size):
        self.size = _pair(size)

    def __call__(self, image) -> Image.Image:
        image = _pil(image, "CenterCrop")
        crop_height, crop_width = self.size
        width, height = image.size
        if crop_width > width or crop_height > height:
            padded = Image.new(image.mode, (max(width, crop_width), max(height, crop_height)))
            left, top = (
                (crop_width - width) // 2 if crop_width > width else 0,
                (crop_height - height) // 2 if crop_height > height else 0,
            )
            padded.paste(image, (left, top))
            image, (width, height) = padded, padded.size
            if (width, height) == (crop_width, crop_height):
                return image
        top = int(round((height - crop_height) / 2.0))
        left = int(round((width - crop_width) / 2.0))
        return image.crop((left, top, left + crop_width, top + crop_height))


class RandomResizedCrop:
    """A random crop of `scale` of the area and `ratio` aspect, resized to `size`."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), interpolation=Image.BILINEAR,
                 antialias=True):  # fmt: skip
        self.size, self.scale, self.ratio, self.interpolation = _pair(size), scale, ratio, interpolation

    def get_params(self, image: Image.Image) -> tuple[int, int, int, int]:
        """Top, left, height, width of the crop: up to 10 random draws, else the central crop of the allowed ratio."""
        width, height = image.size
        area = height * width
        log_ratio = torch.log(torch.tensor(self.ratio))
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(self.scale[0], self.scale[1]).item()
            aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
            w, h = int(round(math.sqrt(target_area * aspect))), int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = torch.randint(0, height - h + 1, size=(1,)).item()
                left = torch.randint(0, width - w + 1, size=(1,)).item()
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w, h = width, int(round(width / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            w, h = int(round(height * max(self.ratio))), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image) -> Image.Image:
        image = _pil(image, "RandomResizedCrop")
        top, left, h, w = self.get_params(image)
        crop = image.crop((left, top, left + w, top + h))
        return crop.resize((self.size[1], self.size[0]), self.interpolation)


class RandomHorizontalFlip:
    """Mirror left-right with probability `p`."""

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, image):
        if torch.rand(1) < self.p:
            if isinstance(image, torch.Tensor):
                return image.flip(-1)
            return _pil(image, "RandomHorizontalFlip").transpose(Image.FLIP_LEFT_RIGHT)
        return image


NAMES = (
    "CenterCrop",
    "Compose",
    "Lambda",
    "Normalize",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ToTensor",
)


def make_modules(
    on_use: Callable[[], None], on_missing: Callable[[str], Exception]
) -> dict[str, types.ModuleType]:
    """`torchvision` and `torchvision.transforms` module objects for `sys.modules`.

    `on_use()` runs when a transform class is first taken from the module (to note the stand-in
    once); a name the stand-in lacks raises `on_missing(name)`.
    """
    from importlib.machinery import ModuleSpec

    this = sys.modules[__name__]
    package = types.ModuleType("torchvision", "optimum-ipu's stand-in for torchvision (transforms only).")
    transforms = types.ModuleType(
        "torchvision.transforms", "optimum-ipu's stand-in for torchvision.transforms."
    )
    package.__spec__ = ModuleSpec("torchvision", None, is_package=True)
    package.__path__ = []
    transforms.__spec__ = ModuleSpec("torchvision.transforms", None)
    package.transforms = transforms
    transforms.__all__ = list(NAMES)

    def package_getattr(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise on_missing(f"torchvision.{name}")

    def transforms_getattr(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in NAMES:
            on_use()
            return getattr(this, name)
        raise on_missing(f"torchvision.transforms.{name}")

    package.__getattr__ = package_getattr
    transforms.__getattr__ = transforms_getattr
    return {"torchvision": package, "torchvision.transforms": transforms}
