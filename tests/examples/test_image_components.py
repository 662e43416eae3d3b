"""Image-classification example pieces: PIL/numpy preprocessing, collator, metrics, plots, arguments."""

import math

import numpy as np
import pytest
import torch
from fixtures import IMAGE_EXAMPLE_DIR, use_example
from PIL import Image

use_example(IMAGE_EXAMPLE_DIR)
from image_metrics import accuracy, multilabel_roc_auc, sigmoid  # noqa: E402
from image_transforms import ImageTransform, collate_images  # noqa: E402
from plots import auc_bars, training_curves  # noqa: E402


def test_grayscale_images_become_normalised_rgb_channels_first():
    image = Image.fromarray(np.array([[0, 255], [255, 0]], dtype=np.uint8))  # mode "L"
    transform = ImageTransform(size=(4, 6), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    out = transform({"image": [image, image.convert("RGBA")], "labels": [[1.0, 0.0], [0.0, 1.0]]})
    pixels = out["pixel_values"][0]
    assert pixels.shape == (3, 4, 6) and pixels.dtype == np.float32
    assert np.allclose(pixels[0], pixels[1]) and np.allclose(pixels[1], pixels[2])  # gray copied to RGB
    assert pixels.min() >= -1.0 and pixels.max() <= 1.0
    assert np.allclose(out["pixel_values"][1], pixels)  # RGBA handled the same
    assert out["labels"] == [[1.0, 0.0], [0.0, 1.0]]


def test_normalisation_uses_the_processor_mean_and_std():
    white = Image.new("RGB", (2, 2), (255, 255, 255))
    pixels = ImageTransform(size=(2, 2), mean=(0.0, 0.5, 1.0), std=(1.0, 0.5, 0.25)).pixel_values(white)
    assert np.allclose(pixels[:, 0, 0], [1.0, 1.0, 0.0])


def test_random_crop_keeps_the_output_size_and_is_seeded():
    image = Image.fromarray(np.arange(64 * 64, dtype=np.uint32).reshape(64, 64).astype(np.uint8))
    first = ImageTransform(size=(16, 16), random_crop_scale=(0.5, 1.0), seed=3).pixel_values(image)
    again = ImageTransform(size=(16, 16), random_crop_scale=(0.5, 1.0), seed=3).pixel_values(image)
    assert first.shape == (3, 16, 16) and np.array_equal(first, again)


def test_collator_types_labels_by_problem():
    pixels = np.zeros((3, 2, 2), np.float32)
    multi = collate_images([{"pixel_values": pixels, "labels": [1.0, 0.0]}] * 2)
    single = collate_images([{"pixel_values": pixels, "labels": 1}] * 2)
    assert multi["pixel_values"].shape == (2, 3, 2, 2)
    assert multi["labels"].dtype == torch.float32 and multi["labels"].shape == (2, 2)
    assert single["labels"].dtype == torch.long


def test_roc_auc_per_finding_and_macro_on_sigmoid_scores():
    labels = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 1], [0, 0, 1]])
    logits = np.array([[3.0, -1.0, 0.0], [-2.0, 2.0, 0.0], [1.0, -0.5, 0.0], [-1.0, 0.5, 0.0]])
    metrics = multilabel_roc_auc(logits, labels, ["a", "b", "c"])
    assert metrics["roc_auc_a"] == 1.0  # positives scored above every negative
    assert metrics["roc_auc_b"] == pytest.approx(
        0.75
    )  # positives 2.0, -0.5 vs negatives -1.0, 0.5: 3 of 4 pairs ordered
    assert math.isnan(metrics["roc_auc_c"])  # only positives: undefined, left out of the mean
    assert metrics["roc_auc"] == pytest.approx((1.0 + 0.75) / 2)
    assert metrics["roc_auc_findings_scored"] == 2


def test_sigmoid_is_stable_and_accuracy_is_top1():
    assert np.allclose(sigmoid(np.array([-1000.0, 0.0, 1000.0])), [0.0, 0.5, 1.0])
    assert accuracy(np.array([[0.1, 2.0], [3.0, 0.0]]), np.array([1, 1]))["accuracy"] == 0.5


def test_plots_are_written_from_the_log_history(tmp_path):
    history = [{"loss": 1.0 / s, "learning_rate": 1e-4 * s, "step": s, "epoch": s / 10} for s in range(1, 6)]
    history.append({"train_runtime": 1.0, "step": 5})
    assert training_curves(history, str(tmp_path)).endswith("training_curves.png")
    assert training_curves([], str(tmp_path)) is None
    path = auc_bars({"Mass": 0.9, "Edema": 0.7}, 0.8, str(tmp_path))
    assert Image.open(path).size[0] > 100
