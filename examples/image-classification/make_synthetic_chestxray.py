"""Generate a small synthetic ChestX-ray14-shaped data set: grayscale PNGs and the label CSV.

The real data set (112,120 images, 42 GB) cannot be downloaded where this project is tested, so the
example runs on images made here, laid out exactly like the NIH release::

    OUT/images/00000001_000.png ...        grayscale PNGs named <patient:08d>_<follow-up:03d>.png
    OUT/Data_Entry_2017_v2020.csv          every column of the real CSV
    OUT/train_val_list.txt, test_list.txt  only with --test_fraction > 0 (split by patient, as NIH's)

Each image is a dim "chest" (body and two darker lungs, with noise) on which each of its findings is
drawn as its own pattern (disc, ring, stripes, checkerboard, ...) in its own cell of a 4 x 4 grid,
with jitter in position and brightness. A ViT can learn that from scratch in a few hundred steps,
so a working pipeline reaches a high ROC AUC and a broken one (wrong labels, leaked split,
softmax instead of sigmoid) shows. Patients have several follow-up images sharing most findings,
which is what makes a split by image leak.

Usage::

    python make_synthetic_chestxray.py --output_dir data/chestxray --patients 300
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from pathlib import Path

import numpy as np
from chestxray import CSV_COLUMNS, FINDINGS, LABEL_FILE, NO_FINDING, TEST_LIST, TRAIN_VAL_LIST
from PIL import Image

GRID = 4  # findings sit in the cells of a GRID x GRID layout, finding k in cell k


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


def draw_xray(findings: list[int], size: int, rng: np.random.Generator) -> np.ndarray:
    """A ``size`` x ``size`` uint8 grayscale image showing the given finding indices."""
    y, x = np.mgrid[0:size, 0:size] / size
    image = np.full((size, size), 70.0)
    body = ((x - 0.5) / 0.45) ** 2 + ((y - 0.55) / 0.5) ** 2 < 1
    image[body] = 110
    for centre in (0.3, 0.7):
        lung = ((x - centre) / 0.17) ** 2 + ((y - 0.5) / 0.32) ** 2 < 1
        image[lung] = 60
    cell = size // GRID
    inner = int(cell * 0.8)
    for kind in findings:
        row, col = divmod(kind, GRID)
        top = row * cell + (cell - inner) // 2 + int(rng.integers(-1, 2))
        left = col * cell + (cell - inner) // 2 + int(rng.integers(-1, 2))
        top, left = max(0, min(top, size - inner)), max(0, min(left, size - inner))
        image[top:top + inner, left:left + inner] += 130 * _pattern(kind, inner, rng)
    image += rng.normal(0, 8, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def sample_patient_findings(rng: random.Random, follow_ups: int, prevalence: float) -> list[list[int]]:
    """Findings per image of one patient: chronic findings recur (80%), new ones appear rarely."""
    chronic = [k for k in range(len(FINDINGS)) if rng.random() < prevalence]
    return [sorted({k for k in chronic if rng.random() < 0.8}
                   | {k for k in range(len(FINDINGS)) if rng.random() < prevalence / 4})
            for _ in range(follow_ups)]


def make_chestxray(output_dir: str | Path, patients: int = 300, max_images_per_patient: int = 5,
                   image_size: int = 128, prevalence: float = 0.15, test_fraction: float = 0.0,
                   seed: int = 0) -> Path:
    """Write the images, the CSV and (with ``test_fraction``) the official-style lists; return the CSV path."""
    output_dir = Path(output_dir)
    images_dir = output_dir / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    rng, np_rng = random.Random(seed), np.random.default_rng(seed)
    rows, images_of = [], {}
    for patient in range(1, patients + 1):
        age, gender = rng.randint(18, 90), rng.choice("MF")
        per_image = sample_patient_findings(rng, rng.randint(1, max_images_per_patient), prevalence)
        images_of[patient] = []
        for follow_up, findings in enumerate(per_image):
            name = f"{patient:08d}_{follow_up:03d}.png"
            Image.fromarray(draw_xray(findings, image_size, np_rng)).save(images_dir / name)
            images_of[patient].append(name)
            spacing = round(rng.uniform(0.139, 0.168), 3)
            rows.append({
                "Image Index": name,
                "Finding Labels": "|".join(FINDINGS[k] for k in findings) or NO_FINDING,
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
    parser.add_argument("--prevalence", type=float, default=0.15, help="chance a patient has each finding")
    parser.add_argument("--test_fraction", type=float, default=0.0,
                        help="if > 0, write train_val_list.txt / test_list.txt with this share of patients in test")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    csv_path = make_chestxray(args.output_dir, args.patients, args.max_images_per_patient, args.image_size,
                              args.prevalence, args.test_fraction, args.seed)
    print(f"wrote {csv_path} and {csv_path.parent / 'images'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
