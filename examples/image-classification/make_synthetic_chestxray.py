"""Generate a small synthetic ChestX-ray14-shaped data set: grayscale PNGs and the label CSV.

The real data set (112,120 images, 42 GB) cannot be downloaded where this project is tested, so the
example runs on images made here, laid out exactly like the NIH release::

    OUT/images/00000001_000.png ...        grayscale PNGs named <patient:08d>_<follow-up:03d>.png
    OUT/Data_Entry_2017_v2020.csv          every column of the real CSV
    OUT/train_val_list.txt, test_list.txt  only with --test_fraction > 0 (split by patient, as NIH's)

Each image is a dim "chest" (body and two darker lungs, with noise) on which each of its findings is
drawn as its own pattern (disc, ring, stripes, checkerboard, ...) around its own place of a 4 x 4
grid. By default the task is hard enough that a small model ends well short of a perfect score, so
a regression in training numerics shows:

- findings are faint (``--contrast``, grey levels against noise of ``--noise``) and larger than
  their grid cell, with jitter, so neighbouring findings overlap;
- each finding occurs with its prevalence in the real data set (`REAL_PREVALENCE`: Infiltration in
  18 % of the images, Hernia in 0.2 %), so rare findings have few positives;
- labels are noisy (``--label_noise``), as NIH's were mined from radiology reports: a drawn finding
  is left out of the CSV with that probability, and an absent one is listed with that probability
  times its prevalence.

Patients have several follow-up images sharing most findings, which is what makes a split by image
leak. ``--easy`` gives the old, easy data (bright non-overlapping patterns, 15 % prevalence for every
finding, exact labels) that a ViT learns to a macro ROC AUC of 1.00.

Usage::

    python make_synthetic_chestxray.py --output_dir data/chestxray --patients 300
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from chestxray import CSV_COLUMNS, FINDINGS, LABEL_FILE, NO_FINDING, TEST_LIST, TRAIN_VAL_LIST
from PIL import Image

GRID = 4  # findings sit around the cells of a GRID x GRID layout, finding k around cell k

# Share of the 112,120 images of NIH ChestX-ray14 that carry each finding (from the label counts of
# Data_Entry_2017: Atelectasis 11,559, Cardiomegaly 2,776, ..., Pneumothorax 5,302).
REAL_PREVALENCE = {
    "Atelectasis": 0.103, "Cardiomegaly": 0.025, "Consolidation": 0.042, "Edema": 0.021, "Effusion": 0.119,
    "Emphysema": 0.022, "Fibrosis": 0.015, "Hernia": 0.002, "Infiltration": 0.177, "Mass": 0.052,
    "Nodule": 0.056, "Pleural_Thickening": 0.030, "Pneumonia": 0.013, "Pneumothorax": 0.047,
}  # fmt: skip


@dataclass(frozen=True)
class Difficulty:
    """How findings are drawn and labelled.

    Attributes:
        contrast: grey levels a finding's pattern adds (or removes) at full strength; 0-255 image.
        noise: standard deviation of the Gaussian pixel noise.
        spread: a finding's patch side in grid cells (> 1: neighbours overlap).
        jitter: largest shift of a patch from its cell's centre, in grid cells.
        label_noise: chance that a drawn finding is missing from the labels; an absent finding is
            labelled with this chance times its prevalence.
    """

    contrast: float = 40.0
    noise: float = 14.0
    spread: float = 1.5
    jitter: float = 0.3
    label_noise: float = 0.1


HARD = Difficulty()
EASY = Difficulty(contrast=130.0, noise=8.0, spread=0.8, jitter=0.0, label_noise=0.0)


def _pattern(kind: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """A ``size`` x ``size`` mask in [-1, 1] with the pattern of finding ``kind`` (negative = darker)."""
    y, x = np.mgrid[0:size, 0:size] / (size - 1) * 2 - 1  # coordinates in [-1, 1]
    radius = np.hypot(x, y)
    period = max(4, size // 5)  # stripes stay resolvable after the resize to the model's input
    i, j = np.mgrid[0:size, 0:size]
    patterns = {
        0: radius < 0.6,                                       # Atelectasis: disc
        1: (radius > 0.45) & (radius < 0.75),                  # Cardiomegaly: ring
        2: (i // (period // 2)) % 2 == 0,                      # Consolidation: horizontal stripes
        3: (j // (period // 2)) % 2 == 0,                      # Edema: vertical stripes
        4: ((i // period) + (j // period)) % 2 == 0,           # Effusion: checkerboard
        5: np.abs(x - y) < 0.2,                                # Emphysema: diagonal
        6: (np.abs(x) < 0.18) | (np.abs(y) < 0.18),            # Fibrosis: cross
        7: (np.abs(x) < 0.55) & (np.abs(y) < 0.55),            # Hernia: filled square
        8: (np.abs(x - y) < 0.2) | (np.abs(x + y) < 0.2),      # Infiltration: X
        9: (y > -0.6) & (y < 0.6) & (np.abs(x) < (y + 0.6) / 1.2 * 0.7),  # Mass: triangle
        10: np.hypot(np.abs(x) - 0.5, np.abs(y) - 0.5) < 0.3,   # Nodule: four small discs
        11: (np.maximum(np.abs(x), np.abs(y)) > 0.55) & (np.maximum(np.abs(x), np.abs(y)) < 0.8),  # frame
        12: (x + 1) / 2,                                       # Pneumonia: horizontal gradient
        13: -(radius < 0.6).astype(float),                     # Pneumothorax: dark disc
    }
    mask = np.asarray(patterns[kind], dtype=np.float64)
    return mask * rng.uniform(0.8, 1.0)


def draw_xray(findings: list[int], size: int, rng: np.random.Generator, difficulty: Difficulty = HARD) -> np.ndarray:
    """A ``size`` x ``size`` uint8 grayscale image showing the given finding indices."""
    y, x = np.mgrid[0:size, 0:size] / size
    image = np.full((size, size), 70.0)
    body = ((x - 0.5) / 0.45) ** 2 + ((y - 0.55) / 0.5) ** 2 < 1
    image[body] = 110
    for centre in (0.3, 0.7):
        lung = ((x - centre) / 0.17) ** 2 + ((y - 0.5) / 0.32) ** 2 < 1
        image[lung] = 60
    cell = size / GRID
    inner = max(4, min(size, int(round(cell * difficulty.spread))))
    shift = int(round(cell * difficulty.jitter))
    for kind in findings:
        row, col = divmod(kind, GRID)
        top = int(round((row + 0.5) * cell - inner / 2)) + int(rng.integers(-shift - 1, shift + 2))
        left = int(round((col + 0.5) * cell - inner / 2)) + int(rng.integers(-shift - 1, shift + 2))
        top, left = max(0, min(top, size - inner)), max(0, min(left, size - inner))
        image[top:top + inner, left:left + inner] += difficulty.contrast * _pattern(kind, inner, rng)
    image += rng.normal(0, difficulty.noise, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def prevalences(prevalence: float | None) -> list[float]:
    """Per-finding chance of appearing on an image: the real data set's, or ``prevalence`` for all."""
    if prevalence is None:
        return [REAL_PREVALENCE[name] for name in FINDINGS]
    if not 0 <= prevalence <= 1:
        raise ValueError(f"prevalence must be in [0, 1], got {prevalence}.")
    return [prevalence] * len(FINDINGS)


def sample_patient_findings(rng: random.Random, follow_ups: int, prevalence: float | list[float]) -> list[list[int]]:
    """Findings per image of one patient: chronic findings recur (80%), new ones appear rarely.

    ``prevalence`` is one chance for every finding or one per finding; an image then shows finding
    k with about that chance (0.8 x p from chronic ones, p / 4 new).
    """
    chance = prevalence if isinstance(prevalence, list) else [prevalence] * len(FINDINGS)
    chronic = [k for k in range(len(FINDINGS)) if rng.random() < chance[k]]
    return [sorted({k for k in chronic if rng.random() < 0.8}
                   | {k for k in range(len(FINDINGS)) if rng.random() < chance[k] / 4})
            for _ in range(follow_ups)]


def noisy_labels(rng: random.Random, findings: list[int], chance: list[float], label_noise: float) -> list[int]:
    """The labels a report-mining labeller would give: drawn findings missed, absent ones listed."""
    if label_noise <= 0:
        return list(findings)
    return [k for k in range(len(FINDINGS))
            if (k in findings and rng.random() >= label_noise)
            or (k not in findings and rng.random() < label_noise * chance[k])]


def make_chestxray(output_dir: str | Path, patients: int = 300, max_images_per_patient: int = 5,
                   image_size: int = 128, prevalence: float | None = None, test_fraction: float = 0.0,
                   seed: int = 0, difficulty: Difficulty = HARD) -> Path:
    """Write the images, the CSV and (with ``test_fraction``) the official-style lists; return the CSV path.

    ``prevalence`` None uses the real data set's per-finding prevalences; a number is the same
    chance for every finding. ``difficulty`` sets contrast, noise, overlap and label noise.
    """
    output_dir = Path(output_dir)
    images_dir = output_dir / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    rng, np_rng = random.Random(seed), np.random.default_rng(seed)
    chance = prevalences(prevalence)
    rows, images_of = [], {}
    for patient in range(1, patients + 1):
        age, gender = rng.randint(18, 90), rng.choice("MF")
        per_image = sample_patient_findings(rng, rng.randint(1, max_images_per_patient), chance)
        images_of[patient] = []
        for follow_up, findings in enumerate(per_image):
            name = f"{patient:08d}_{follow_up:03d}.png"
            Image.fromarray(draw_xray(findings, image_size, np_rng, difficulty)).save(images_dir / name)
            images_of[patient].append(name)
            labels = noisy_labels(rng, findings, chance, difficulty.label_noise)
            spacing = round(rng.uniform(0.139, 0.168), 3)
            rows.append({
                "Image Index": name,
                "Finding Labels": "|".join(FINDINGS[k] for k in labels) or NO_FINDING,
                "Follow-up #": follow_up, "Patient ID": patient, "Patient Age": age + follow_up // 3,
                "Patient Gender": gender, "View Position": rng.choice(("PA", "PA", "AP")),
                "OriginalImage[Width": rng.randint(2000, 3056), "Height]": rng.randint(2000, 3056),
                "OriginalImagePixelSpacing[x": spacing, "y]": spacing,
            })
    csv_path = output_dir / LABEL_FILE
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    if test_fraction > 0:
        ordered = list(images_of)
        rng.shuffle(ordered)
        test_patients = set(ordered[: max(1, round(test_fraction * len(ordered)))])
        for file_name, wanted in ((TEST_LIST, True), (TRAIN_VAL_LIST, False)):
            names = [n for p in sorted(images_of) if (p in test_patients) == wanted for n in images_of[p]]
            (output_dir / file_name).write_text("\n".join(names) + "\n")
    return csv_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--patients", type=int, default=300)
    parser.add_argument("--max_images_per_patient", type=int, default=5)
    parser.add_argument("--image_size", type=int, default=128, help="pixels per side (the real images: 1024)")
    parser.add_argument("--prevalence", type=float, default=None,
                        help="chance of each finding on an image (default: the real data set's per finding; "
                             "0.15 for all with --easy)")
    parser.add_argument("--contrast", type=float, help=f"grey levels of a finding (default {HARD.contrast:g})")
    parser.add_argument("--noise", type=float, help=f"pixel noise standard deviation (default {HARD.noise:g})")
    parser.add_argument("--label_noise", type=float,
                        help=f"chance a drawn finding is missing from the labels (default {HARD.label_noise:g})")
    parser.add_argument("--easy", action="store_true",
                        help="bright, non-overlapping findings, 15%% prevalence, exact labels (values given "
                             "explicitly still win)")
    parser.add_argument("--test_fraction", type=float, default=0.0,
                        help="if > 0, write train_val_list.txt / test_list.txt with this share of patients in test")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    difficulty = EASY if args.easy else HARD
    given = {k: getattr(args, k) for k in ("contrast", "noise", "label_noise") if getattr(args, k) is not None}
    difficulty = replace(difficulty, **given)
    if not 0 <= difficulty.label_noise < 1 or difficulty.noise < 0:
        parser.error("--label_noise must be in [0, 1) and --noise >= 0")
    prevalence = 0.15 if args.easy and args.prevalence is None else args.prevalence
    csv_path = make_chestxray(args.output_dir, args.patients, args.max_images_per_patient, args.image_size,
                              prevalence, args.test_fraction, args.seed, difficulty)
    print(f"wrote {csv_path} and {csv_path.parent / 'images'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
