"""The image example's data checks (examples/image-classification/image_checks.py, image_data.py).

What the bad-input table does not show: which files pass (no false alarms), how mixed pixel modes
become RGB (against arrays worked out by hand), that the check runs before the model is built, the
--skip_bad_images count in the log, the progress bar, and the unlabelled test split.
"""

import io
import logging
import struct
import zlib

import numpy as np
import pytest
from fixtures import IMAGE_EXAMPLE_DIR, tiny_vit_model_dir, use_example
from PIL import Image

use_example(IMAGE_EXAMPLE_DIR)
import image_checks  # noqa: E402  (on sys.path only now)
import run_image_classification as run_ic  # noqa: E402
from image_checks import image_problem, open_image  # noqa: E402
from image_transforms import ImageTransform  # noqa: E402

# A 4-layer model on Graphcore/vit-base-ipu, 8 images per step.
IPU_FLAGS = ["--ipu_config_name", "Graphcore/vit-base-ipu", "--ipu_config_overrides", "layers_per_ipu=[1 1 1 1]",
             "--gradient_accumulation_steps", "8", "--per_device_train_batch_size", "1", "--fp32",
             "--dataloader_num_workers", "0", "--save_strategy", "no", "--report_to", "none", "--use_cpu"]  # fmt: skip


def encoded(image: Image.Image, image_format: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, image_format)
    return buffer.getvalue()


def noise(shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def png_16_bit(colour_type: int, samples: tuple[int, ...], size: int = 4) -> bytes:
    """A 16-bit PNG written by hand (PIL writes none for colour): every pixel holds `samples`."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + struct.pack(f">{len(samples)}H", *samples) * size
    header = struct.pack(">IIBBBBB", size, size, 16, colour_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * size))
        + chunk(b"IEND", b"")
    )


# -- which files pass -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["1", "L", "LA", "P", "RGB", "RGBA", "CMYK"])
def test_every_8_bit_mode_passes(mode):
    image = Image.fromarray(noise((8, 8, 3))).convert(mode)
    assert image_problem(encoded(image, "TIFF" if mode == "CMYK" else "PNG")) is None


def test_data_after_the_end_marker_is_no_false_alarm():
    jpeg = encoded(Image.fromarray(noise((16, 16, 3))), "JPEG")
    assert image_problem(jpeg + b"trailing data a camera appended") is None  # decoded in full, fine
    assert image_problem(jpeg[:-2]) == "truncated JPEG"


@pytest.mark.parametrize("image_format", ["PNG", "JPEG", "GIF"])
def test_a_file_cut_in_half_is_truncated(image_format):
    data = encoded(
        Image.fromarray(noise((32, 32, 3))).convert("RGB" if image_format != "GIF" else "P"), image_format
    )
    assert image_problem(data[: len(data) // 2]).startswith(("truncated", "corrupt"))


@pytest.mark.parametrize(
    "data, mode",
    [(png_16_bit(0, (4095,)), "I;16"), (png_16_bit(2, (4095, 2048, 0)), "RGB"), (png_16_bit(6, (1, 2, 3, 65535)), "RGBA"),
     (encoded(Image.fromarray(np.zeros((4, 4), np.float32)), "TIFF"), "F")],
)  # fmt: skip
def test_more_than_8_bits_per_channel_is_refused(data, mode):
    assert image_problem(data).startswith(f"pixel mode {mode}")


# -- mixed modes become RGB -----------------------------------------------------------------------


def to_unit(array: np.ndarray) -> np.ndarray:
    """A [H, W, 3] uint8 reference → what ImageTransform gives with mean 0 and std 1: [3, H, W] in [0, 1]."""
    return array.transpose(2, 0, 1).astype(np.float32) / 255.0


def test_mixed_modes_become_rgb_as_documented():
    gray = noise((4, 4))
    rgb = noise((4, 4, 3), seed=1)
    alpha = noise((4, 4), seed=2)
    palette = noise((256, 3), seed=3)
    indices = noise((4, 4), seed=4)
    paletted = Image.fromarray(indices, "P")
    paletted.putpalette(palette.flatten().tolist())
    cases = {
        "L": (Image.fromarray(gray), np.repeat(gray[..., None], 3, axis=2)),  # gray copied to 3 channels
        "LA": (Image.fromarray(np.dstack([gray, alpha]), "LA"), np.repeat(gray[..., None], 3, axis=2)),  # alpha dropped
        "RGBA": (Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), rgb),  # alpha dropped, stored colour kept
        "P": (paletted, palette[indices]),  # looked up in the palette
        "1": (Image.fromarray(gray > 127), np.repeat(np.where(gray > 127, 255, 0)[..., None], 3, axis=2).astype(np.uint8)),
    }  # fmt: skip
    transform = ImageTransform(size=(4, 4), mean=(0, 0, 0), std=(1, 1, 1))
    for mode, (image, reference) in cases.items():
        assert image.mode == mode
        undecoded = {"bytes": encoded(image), "path": None}  # as the data set hands it over
        assert np.allclose(transform.pixel_values(undecoded), to_unit(reference)), mode


def test_a_file_that_fails_to_decode_names_itself(tmp_path):
    path = tmp_path / "inside.png"
    data = encoded(Image.fromarray(noise((32, 32))))
    path.write_bytes(data[:80] + data[-12:])  # the middle cut out, the end intact: passes the quick check
    assert image_problem(path) is None or "truncated" in image_problem(path)
    with pytest.raises(ValueError, match=r"inside.png cannot be decoded .*Replace or delete the file"):
        open_image({"bytes": None, "path": str(path)})


# -- the run: before the model, skipping with a count, progress, unlabelled test split ------------


def image_folder(root, per_class: int = 6, broken: int = 0):
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for n in range(per_class):
            (root / label / f"{n}.png").write_bytes(encoded(Image.fromarray(noise((16, 16), seed=n))))
    for n in range(broken):
        path = root / "a" / f"{n}.png"
        path.write_bytes(path.read_bytes()[:-40])
    return root


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    return tiny_vit_model_dir(tmp_path_factory.mktemp("vit"), num_labels=2)


def run(tmp_path, vit, *flags):
    return run_ic.main(["--model_name_or_path", str(vit), *IPU_FLAGS, "--output_dir", str(tmp_path / "out"),
                        "--cache_dir", str(tmp_path / "cache"), *flags])  # fmt: skip


def test_bad_images_fail_before_the_model_is_built(tmp_path, vit, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was built before the images were checked")

    monkeypatch.setattr(run_ic, "build_model", no_model)
    folder = image_folder(tmp_path / "train", broken=1)
    with pytest.raises(ValueError, match=r"train/a/0.png: truncated PNG"):
        run(tmp_path, vit, "--train_dir", str(folder), "--validation_dir", str(folder), "--do_train")


def test_skip_bad_images_trains_without_them_and_logs_the_count(tmp_path, vit, caplog):
    train = image_folder(tmp_path / "train", per_class=6, broken=2)
    with caplog.at_level(logging.WARNING, logger="image_checks"):
        metrics = run(tmp_path, vit, "--train_dir", str(train), "--validation_dir", str(train), "--do_train",
                      "--do_eval", "--max_steps", "1", "--skip_bad_images")  # fmt: skip
    assert metrics["train_samples"] == 10 and metrics["eval_samples"] == 10 and metrics["train_steps"] == 1
    skipped = [r.getMessage() for r in caplog.records if "--skip_bad_images" in r.getMessage()]
    assert len(skipped) == 2 and all(
        m.startswith("Skipping 2 of 12 images") for m in skipped
    )  # train, validation
    assert "a/0.png: truncated PNG" in skipped[0] and "a/1.png: truncated PNG" in skipped[0]


def test_large_sets_show_a_progress_bar(tmp_path, capsys, monkeypatch):
    import datasets

    images = [{"bytes": encoded(Image.fromarray(noise((4, 4), seed=n))), "path": None} for n in range(3)]
    dataset = datasets.Dataset.from_dict(
        {"image": images}, features=datasets.Features(image=datasets.Image())
    )
    image_checks.find_bad_images(
        image_checks.undecoded(dataset, "image", "x"), "image", "train", show_progress=True
    )
    assert "Checking the train images" not in capsys.readouterr().err  # 3 images: no bar
    monkeypatch.setattr(image_checks, "PROGRESS_FROM", 3)
    report = image_checks.find_bad_images(
        image_checks.undecoded(dataset, "image", "x"), "image", "train", True
    )
    assert "Checking the train images" in capsys.readouterr().err and report.bad == []


def test_a_test_split_without_labels_is_predicted_without_scores(tmp_path, vit):
    import datasets

    features = datasets.Features(image=datasets.Image(), label=datasets.ClassLabel(names=["a", "b"]))
    folder = tmp_path / "hub" / "data"
    folder.mkdir(parents=True)
    for split, labels in (("train", [0, 1] * 4), ("test", [-1] * 4)):
        images = [
            {"bytes": encoded(Image.fromarray(noise((16, 16), seed=n))), "path": None}
            for n in range(len(labels))
        ]
        datasets.Dataset.from_dict({"image": images, "label": labels}, features=features).to_parquet(
            str(folder / f"{split}-00000-of-00001.parquet")
        )
    metrics = run(tmp_path, vit, "--dataset_name", str(folder.parent), "--do_predict")
    assert "test_runtime" in metrics and "test_accuracy" not in metrics and "test_loss" not in metrics
