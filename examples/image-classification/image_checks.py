"""Checking the images and labels a run will read, before its first step.

A truncated file deep in a data set used to surface as PIL's ``OSError: image file is truncated``,
with no file name, after training had started. Here every image of the splits the run reads is
checked up front, cheaply (the header and the last bytes; a full decode only where a file's end
does not look right or the format has no end marker), and the error names each bad file with the
fix; ``--skip_bad_images`` drops them instead, with a count in the log.

Pixel modes: images are converted to RGB one by one, so a data set may mix them. Grayscale (``L``,
``1``) is copied to the three channels, a palette (``P``) is looked up, the alpha channel of
``LA`` / ``RGBA`` / ``PA`` is dropped (transparent pixels keep their stored colour), ``CMYK`` and
``YCbCr`` use PIL's conversion. Images with more than 8 bits per channel (16-bit grayscale or
colour PNGs, 32-bit integer and float images) are refused: PIL would clip 16-bit grayscale to white
and reads 16-bit colour PNGs as their top 8 bits, which darkens 10- or 12-bit data stored in 16 bits
(most medical images); the right window depends on the data, so the user converts them.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

USABLE_MODES = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr")
"""Pixel modes converted to RGB faithfully (see the module docstring for how)."""
HIGH_BIT_DEPTH_MODES = ("I", "F", "I;16", "I;16L", "I;16B", "I;16N")
"""PIL modes with more than 8 bits per channel."""
EIGHT_BIT_FIX = (
    "convert the images to 8 bits per channel with the window your data uses (value >> 8 for full-range "
    "16-bit data, value >> 4 for 12-bit data stored in 16 bits; see docs/bad-inputs.md)"
)
# What a complete file ends with: PNG's IEND chunk, JPEG's end-of-image marker, GIF's trailer.
_FILE_ENDS = {"PNG": b"IEND\xaeB`\x82", "JPEG": b"\xff\xd9", "GIF": b"\x3b"}
PROGRESS_FROM = 1_000  # images in a split from which the check shows a progress bar
_SHOWN = 5  # bad files quoted in a message; the count covers the rest


def _high_bit_depth(image) -> bool:
    """More than 8 bits per channel, seen from the header: the mode, or a 16-bit raw mode (PNG RGB;16B)."""
    return image.mode in HIGH_BIT_DEPTH_MODES or any(";16" in str(tile[3]) for tile in image.tile or [])


def image_problem(source: str | os.PathLike | bytes) -> str | None:
    """Why an image (a file path, or its bytes) cannot be trained on, or None when it can.

    Reads the header and the last bytes; a PNG, JPEG or GIF without its end marker was cut off (an
    interrupted download or extraction), which a full decode confirms (a few files carry data after
    the marker). Formats without an end marker are decoded fully.
    """
    from PIL import Image, UnidentifiedImageError

    data = source if isinstance(source, bytes) else None
    if data is None:
        size = Path(source).stat().st_size
    else:
        size = len(data)
    if size == 0:
        return "empty file"
    opened = io.BytesIO(data) if data is not None else source
    image_format = "image"
    try:
        with Image.open(opened) as image:
            image_format = image.format or image_format
            mode, deep = image.mode, _high_bit_depth(image)
            end = _FILE_ENDS.get(image_format)
            if end is None or not _tail(source, size).rstrip(b"\x00").endswith(end):
                image.load()
    except UnidentifiedImageError:
        return "not an image (PIL cannot identify the format)"
    except (OSError, SyntaxError, ValueError) as err:
        reason = str(err) or type(err).__name__
        return (
            f"truncated {image_format}"
            if "truncated" in reason.lower()
            else f"corrupt {image_format}: {reason}"
        )
    if deep or mode not in USABLE_MODES:
        return (
            f"pixel mode {mode}{' (16 bits per channel)' if deep and mode in USABLE_MODES else ''}, not 8-bit"
        )
    return None


def _tail(source: str | os.PathLike | bytes, size: int) -> bytes:
    if isinstance(source, bytes):
        return source[-16:]
    with open(source, "rb") as handle:
        handle.seek(max(0, size - 16))
        return handle.read()


def fix_for(problems: list[str]) -> str:
    """What to do about these `image_problem`s: replace broken files; convert deep ones to 8 bits."""
    fixes = []
    if any("not 8-bit" not in problem for problem in problems):
        fixes.append("Replace or delete the broken files (re-download or re-extract them)")
    if any("not 8-bit" in problem for problem in problems):
        fixes.append(EIGHT_BIT_FIX[0].upper() + EIGHT_BIT_FIX[1:])
    return "; ".join(fixes)


def listing(items: list[str], shown: int = _SHOWN) -> str:
    """The first `shown` items, comma-separated, and how many more there are."""
    more = f" ... and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def progress(items, total: int, description: str, show: bool):
    """`items` behind a tqdm progress bar when `show` and the set is large (`PROGRESS_FROM`)."""
    from tqdm.auto import tqdm

    return tqdm(items, total=total, desc=description, unit="image", disable=not show or total < PROGRESS_FROM)


def image_name(value: dict, split: str, row: int) -> str:
    """A bad image as a user finds it: its file path, else its row in the split (images stored as bytes)."""
    path = value.get("path") if isinstance(value, dict) else None
    return path or f"{split} row {row}"


def open_image(value):
    """An undecoded ``datasets.Image`` value (``{"bytes", "path"}``) or a PIL image → a loaded PIL image.

    Decoding here rather than in `datasets` lets a file that passed the quick check but fails to
    decode (a corrupt middle) name itself instead of raising a bare ``OSError``.
    """
    from PIL import Image

    if not isinstance(value, dict):
        return value
    path = value.get("path")
    try:
        image = Image.open(io.BytesIO(value["bytes"]) if value.get("bytes") else path)
        image.load()
    except (OSError, SyntaxError, ValueError) as err:
        raise ValueError(
            f"Image {path or '(stored as bytes, no file name)'} cannot be decoded ({err}); the "
            "check before training reads only each file's header and end. Replace or delete the file "
            "and start again."
        ) from err
    return image


@dataclass
class SplitReport:
    """What the check found in one split: rows of bad images, named, with the problem."""

    split: str
    rows: int
    bad: list[tuple[int, str, str]]  # (row, name, problem)

    def described(self) -> list[str]:
        return [f"{name}: {problem}" for _, name, problem in self.bad]


def _undecoded_batches(dataset, column: str, batch_size: int = 256) -> Iterator[list]:
    for batch in dataset.select_columns([column]).iter(batch_size=batch_size):
        yield from batch[column]


def find_bad_images(dataset, column: str, split: str, show_progress: bool = False) -> SplitReport:
    """Check every image of ``dataset[column]`` (an undecoded ``datasets.Image`` column) with `image_problem`."""
    bad = []
    rows = progress(
        _undecoded_batches(dataset, column), len(dataset), f"Checking the {split} images", show_progress
    )
    for row, value in enumerate(rows):
        source = (value.get("bytes") or value.get("path")) if value else None
        problem = "no image" if source is None else _problem_or_missing(source)
        if problem:
            bad.append((row, image_name(value or {}, split, row), problem))
    return SplitReport(split, len(dataset), bad)


def _problem_or_missing(source: str | bytes) -> str | None:
    if isinstance(source, str) and not os.path.isfile(source):
        return "no such file"
    return image_problem(source)


def undecoded(dataset, column: str, source: str):
    """`dataset` with `column` left as ``{"bytes", "path"}`` (decoded by `open_image` in the transform)."""
    import datasets

    feature = dataset.features.get(column)
    if not isinstance(feature, datasets.Image):
        raise ValueError(
            f"Column {column!r} of {source} holds {feature}, not images; give the image column with "
            f"--image_column_name (the columns are {dataset.column_names})."
        )
    return dataset.cast_column(column, datasets.Image(decode=False))


def keep_good_images(
    dataset, column: str, split: str, source: str, skip_bad: bool, show_progress: bool = False
):
    """Check a split's images before training: a `ValueError` naming the bad ones, or (`skip_bad`) drop them.

    Returns the split with its image column undecoded (see `undecoded`), bad rows removed when skipping.
    """
    dataset = undecoded(dataset, column, source)
    report = find_bad_images(dataset, column, split, show_progress)
    if not report.bad:
        return dataset
    if not skip_bad:
        raise ValueError(
            f"{len(report.bad)} of {report.rows} images in the {split} split of {source} cannot be trained on: "
            f"{listing(report.described())}. {fix_for([problem for _, _, problem in report.bad])}, or pass "
            "--skip_bad_images to train without them."
        )
    logger.warning(
        "Skipping %d of %d images in the %s split (--skip_bad_images): %s",
        len(report.bad),
        report.rows,
        split,
        listing(report.described()),
    )
    dropped = {row for row, _, _ in report.bad}
    return dataset.select([row for row in range(report.rows) if row not in dropped])


def check_class_labels(dataset, column: str, names: list[str], split: str, source: str) -> None:
    """Every label of a single-label split is a class index 0 .. len(names) - 1; else a `ValueError`.

    -1 is how `datasets` marks an unlabelled image (the test splits of many Hub data sets).
    """
    labels = dataset[column]
    outside = [
        (row, label) for row, label in enumerate(labels) if label is None or not 0 <= label < len(names)
    ]
    if outside:
        fixes = []
        if any(label in (-1, None) for _, label in outside):
            fixes.append(
                "-1 marks an unlabelled image: train and evaluate on labelled images only (remove these "
                "rows, or pick a split that has labels)"
            )
        if any(label not in (-1, None) for _, label in outside):
            fixes.append(
                f"a label is an index into the {len(names)} class names: list every class in the label "
                "column's ClassLabel names, or correct these labels"
            )
        shown = listing([f"row {row}: {label}" for row, label in outside])
        raise ValueError(
            f"{len(outside)} of {len(labels)} labels in column {column!r} of the {split} split of {source} are "
            f"outside the label set 0..{len(names) - 1} {names}: {shown}. " + "; ".join(fixes) + "."
        )


def require_rows(dataset, split: str, source: str, fix: str) -> None:
    """An empty split is an error that says which split, where it came from and how to fill it."""
    if len(dataset) == 0:
        raise ValueError(f"The {split} split of {source} is empty (0 images); {fix}")
