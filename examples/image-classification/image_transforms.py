"""Image preprocessing with PIL and numpy only (no torchvision), and the batch collator.

torchvision cannot be installed here without pulling a CUDA build of torch, and ViT needs little:
convert to RGB (ChestX-ray14 PNGs are grayscale, a few RGBA), resize to the model's input size,
scale to [0, 1], normalise per channel with the image processor's mean and std, lay out as
channels-first. Training may add a random resized crop; X-rays are never flipped (the heart is on
the left: a mirrored chest is a different anatomy).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from image_checks import EIGHT_BIT_FIX, HIGH_BIT_DEPTH_MODES, open_image
from PIL import Image


@dataclass
class ImageTransform:
    """Turn a batch of PIL images into ``pixel_values`` for ``datasets.Dataset.set_transform``.

    Attributes:
        size: output (height, width).
        mean, std: per-channel normalisation, after scaling pixels to [0, 1].
        image_column, label_column: the data set's columns; the label column is passed through as
            ``labels`` (float vectors for multi-label, class indices for single-label).
        random_crop_scale: if set, ``(min, max)`` share of the image area kept by a random crop before
            resizing (training augmentation); ``None`` only resizes.
        seed: seed of the crop's random generator.
    """

    size: tuple[int, int]
    mean: Sequence[float] = (0.5, 0.5, 0.5)
    std: Sequence[float] = (0.5, 0.5, 0.5)
    image_column: str = "image"
    label_column: str = "labels"
    random_crop_scale: tuple[float, float] | None = None
    seed: int = 0

    def __post_init__(self):
        self._rng = random.Random(self.seed)
        self._mean = np.asarray(self.mean, dtype=np.float32).reshape(3, 1, 1)
        self._std = np.asarray(self.std, dtype=np.float32).reshape(3, 1, 1)

    def _crop(self, image: Image.Image) -> Image.Image:
        low, high = self.random_crop_scale
        width, height = image.size
        scale = self._rng.uniform(low, high)
        w, h = max(1, round(width * scale**0.5)), max(1, round(height * scale**0.5))
        left, top = self._rng.randint(0, width - w), self._rng.randint(0, height - h)
        return image.crop((left, top, left + w, top + h))

    def pixel_values(self, image: Image.Image | dict) -> np.ndarray:
        """One image → a float32 ``[3, height, width]`` array; 16-bit and float images are refused.

        ``image`` is a PIL image or an undecoded ``datasets.Image`` value (``{"bytes", "path"}``, see
        `image_checks.open_image`). Every 8-bit mode becomes RGB (see `image_checks` for how); PIL's
        ``convert("RGB")`` would clip 16-bit pixels to white, training on blank images.
        """
        image = open_image(image)
        if image.mode in HIGH_BIT_DEPTH_MODES:
            name = getattr(image, "filename", "") or "an image of the data set"
            raise ValueError(f"{name} has pixel mode {image.mode} (more than 8 bits per channel); {EIGHT_BIT_FIX}.")
        image = image.convert("RGB")
        if self.random_crop_scale is not None:
            image = self._crop(image)
        height, width = self.size
        if image.size != (width, height):
            image = image.resize((width, height), Image.Resampling.BILINEAR)
        array = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0
        return (array - self._mean) / self._std

    def __call__(self, batch: dict) -> dict:
        out = {"pixel_values": [self.pixel_values(image) for image in batch[self.image_column]]}
        if self.label_column in batch:
            out["labels"] = batch[self.label_column]
        return out


def collate_images(examples: list[dict]) -> dict[str, torch.Tensor]:
    """Stack ``pixel_values``; labels become float (multi-label vectors) or long (class indices)."""
    batch = {"pixel_values": torch.from_numpy(np.stack([np.asarray(e["pixel_values"]) for e in examples]))}
    if "labels" in examples[0]:
        labels = [e["labels"] for e in examples]
        multi_label = isinstance(labels[0], (list, tuple, np.ndarray))
        batch["labels"] = torch.tensor(np.asarray(labels), dtype=torch.float32 if multi_label else torch.long)
    return batch
