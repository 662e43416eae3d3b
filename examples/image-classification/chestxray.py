"""NIH ChestX-ray14: reading the label CSV, N-hot labels, a split by patient, and `metadata.jsonl`.

The data set is a folder of PNGs plus ``Data_Entry_2017_v2020.csv`` with one row per image
(``Image Index``, ``Finding Labels`` such as ``Effusion|Mass``, ``Follow-up #``, ``Patient ID``,
``Patient Age``, ``Patient Gender``, ``View Position``, ``OriginalImage[Width``, ``Height]``,
``OriginalImagePixelSpacing[x``, ``y]``), and optionally the official ``train_val_list.txt`` /
``test_list.txt``.

Two decisions differ from Graphcore's walkthrough, on purpose:

* **Labels** are N-hot over the 14 findings only. ``No Finding`` is not a 15th class but the
  all-zero vector: it means "none of the 14", and as a class of its own it would be a label the
  model could predict together with a finding, which is contradictory.
* **Splits** are by ``Patient ID``: one patient has up to ~180 follow-up images that look alike, so
  a random image-level split puts the same patients in train and validation and overstates the
  validation AUC. When the official lists are present, ``test_list.txt`` is the test split (it is
  patient-disjoint from ``train_val_list.txt``) and train/validation are split by patient inside
  ``train_val_list.txt``.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from image_checks import fix_for, image_problem, listing, progress

logger = logging.getLogger(__name__)

FINDINGS = (
    "Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Effusion", "Emphysema", "Fibrosis",
    "Hernia", "Infiltration", "Mass", "Nodule", "Pleural_Thickening", "Pneumonia", "Pneumothorax",
)
"""The 14 findings, in the alphabetical order used for the N-hot label vector."""

NO_FINDING = "No Finding"
LABEL_FILE = "Data_Entry_2017_v2020.csv"
CSV_COLUMNS = (
    "Image Index", "Finding Labels", "Follow-up #", "Patient ID", "Patient Age", "Patient Gender",
    "View Position", "OriginalImage[Width", "Height]", "OriginalImagePixelSpacing[x", "y]",
)
"""The header of the real ``Data_Entry_2017_v2020.csv`` (its brackets split across columns)."""
REQUIRED_COLUMNS = ("Image Index", "Finding Labels", "Patient ID")
TRAIN_VAL_LIST, TEST_LIST = "train_val_list.txt", "test_list.txt"
_SHOWN = 5  # offending entries quoted in an error message


@dataclass(frozen=True)
class XrayRecord:
    """One labelled image: file name, patient, the CSV's finding string and its N-hot vector."""

    image: str
    patient_id: str
    finding_labels: str
    labels: tuple[float, ...]


def n_hot(finding_labels: str) -> list[float]:
    """``"Effusion|Mass"`` → a 14-long 0/1 vector over `FINDINGS`; ``"No Finding"`` → all zeros.

    Raises:
        ValueError: for a label outside the 14 findings and ``No Finding`` (naming it and the
            known labels), an empty string, or ``No Finding`` combined with a finding.
    """
    names = [name.strip() for name in finding_labels.split("|") if name.strip()]
    if not names:
        raise ValueError("Empty `Finding Labels`; use 'No Finding' for an image without findings.")
    unknown = [name for name in names if name not in FINDINGS and name != NO_FINDING]
    if unknown:
        raise ValueError(f"Unknown finding label(s) {unknown} in {finding_labels!r}; known labels are "
                         f"{list(FINDINGS)} and {NO_FINDING!r} (spelling and case matter, e.g. 'Pleural_Thickening').")
    if NO_FINDING in names and len(names) > 1:
        raise ValueError(f"{finding_labels!r} combines {NO_FINDING!r} with findings; an image has either.")
    vector = [0.0] * len(FINDINGS)
    for name in names:
        if name != NO_FINDING:
            vector[FINDINGS.index(name)] = 1.0
    return vector


def decode_labels(vector) -> str:
    """The inverse of `n_hot`: a 0/1 vector back to ``"A|B"`` (or ``"No Finding"``)."""
    names = [name for name, value in zip(FINDINGS, vector) if value >= 0.5]
    return "|".join(names) or NO_FINDING


def read_label_csv(path: str | os.PathLike) -> list[XrayRecord]:
    """Read and check ``Data_Entry_2017_v2020.csv`` into records with N-hot labels.

    Errors name the file, the problem and the fix: missing columns, duplicate images, unknown labels
    (all offending rows are reported together, not just the first).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Label file {str(path)!r} not found; download {LABEL_FILE} from the NIH "
                                "ChestX-ray14 release into the data folder.")
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        header = [name.strip() for name in (reader.fieldnames or [])]
        missing = [column for column in REQUIRED_COLUMNS if column not in header]
        if missing:
            raise ValueError(f"{path} lacks the column(s) {missing} (it has {header}). Expected the header of "
                             f"{LABEL_FILE}: {', '.join(CSV_COLUMNS)}.")
        rows = [{key.strip(): (value or "").strip() for key, value in row.items() if key} for row in reader]

    records, bad_labels, seen, duplicates = [], [], set(), []
    for line, row in enumerate(rows, start=2):
        image = row["Image Index"]
        if image in seen:
            duplicates.append(image)
        seen.add(image)
        try:
            labels = n_hot(row["Finding Labels"])
        except ValueError as err:
            bad_labels.append(f"line {line} ({image}): {err}")
            continue
        records.append(XrayRecord(image, row["Patient ID"], row["Finding Labels"], tuple(labels)))
    if bad_labels:
        raise ValueError(f"{path}: {len(bad_labels)} row(s) with bad `Finding Labels`:\n  "
                         + "\n  ".join(bad_labels[:_SHOWN]) + ("\n  ..." if len(bad_labels) > _SHOWN else ""))
    if duplicates:
        raise ValueError(f"{path} lists {len(duplicates)} image(s) twice: {listing(duplicates)}; "
                         "each `Image Index` must appear once.")
    if not records:
        raise ValueError(f"{path} has a header but no rows.")
    return records


def check_images(records: list[XrayRecord], images_dir: str | os.PathLike, skip_missing: bool = False,
                 skip_bad: bool = False, show_progress: bool = False) -> list[XrayRecord]:
    """Keep the records whose image exists and is usable (see `image_checks.image_problem`); report the rest.

    Only the header and the last bytes of each image are read (cheap even for 112,120 files); an empty,
    truncated or 16-bit file, or one that is not an image, fails, naming every such file.

    Args:
        skip_missing: drop listed-but-absent images with a warning instead of failing (for a partial
            download of the 12 ``images_*.tar.gz`` archives).
        skip_bad: drop unusable files with a warning (their count and names) instead of failing.
        show_progress: a progress bar over the files (from `image_checks.PROGRESS_FROM` images).
    """

    images_dir = Path(images_dir)
    if not images_dir.is_dir():
        raise FileNotFoundError(f"Image folder {str(images_dir)!r} not found; extract the images_*.tar.gz "
                                "archives so the PNGs sit in <chestxray_dir>/images/.")
    present = set(os.listdir(images_dir))
    missing = [r.image for r in records if r.image not in present]
    if missing and not skip_missing:
        raise FileNotFoundError(
            f"{len(missing)} of {len(records)} images listed in the CSV are not in {images_dir}: {listing(missing)}. "
            "Extract all images_*.tar.gz archives there, or pass --skip_missing_images to train on the images present."
        )
    if missing:
        logger.warning("Skipping %d listed images not found in %s (--skip_missing_images).", len(missing), images_dir)
    kept, unreadable = [], []
    for record in progress([r for r in records if r.image in present], len(records) - len(missing),
                           "Checking the images", show_progress):
        problem = image_problem(images_dir / record.image)
        if problem:
            unreadable.append(f"{record.image} ({problem})")
        else:
            kept.append(record)
    if unreadable and not skip_bad:
        raise ValueError(f"{len(unreadable)} image(s) in {images_dir} cannot be trained on: {listing(unreadable)}. "
                         f"{fix_for(unreadable)}, remove their rows from the CSV, or pass --skip_bad_images to "
                         "train without them.")
    if unreadable:
        logger.warning("Skipping %d of %d images in %s that cannot be trained on (--skip_bad_images): %s",
                       len(unreadable), len(records), images_dir, listing(unreadable))
    if not kept:
        raise FileNotFoundError(f"None of the {len(records)} images listed in the CSV is usable in {images_dir}; "
                                "extract the images_*.tar.gz archives there.")
    return kept


def split_by_patient(records: list[XrayRecord], validation_fraction: float, seed: int = 0) -> dict[str, str]:
    """Assign every image to ``train`` or ``validation`` so that no patient is in both.

    Patients are shuffled (deterministically in ``seed``) and moved to validation until it holds at
    least ``validation_fraction`` of the images, so the fraction is about images, as in the
    walkthrough's 5%, while the unit of the split is the patient.
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"The validation fraction must be between 0 and 1, got {validation_fraction}.")
    images_of = defaultdict(list)
    for record in records:
        images_of[record.patient_id].append(record.image)
    patients = sorted(images_of)
    if len(patients) < 2:
        raise ValueError("A split by patient needs at least two patients.")
    random.Random(seed).shuffle(patients)
    target = math.ceil(validation_fraction * len(records))
    split, in_validation = {}, 0
    for index, patient in enumerate(patients):
        # Always leave at least one patient for training.
        goes_to_validation = in_validation < target and index < len(patients) - 1
        for image in images_of[patient]:
            split[image] = "validation" if goes_to_validation else "train"
        in_validation += len(images_of[patient]) if goes_to_validation else 0
    return split


def read_image_list(path: Path) -> set[str]:
    return {line.strip() for line in path.read_text().splitlines() if line.strip()}


def assign_splits(records: list[XrayRecord], data_dir: str | os.PathLike, validation_fraction: float,
                  seed: int = 0) -> dict[str, str]:
    """Image → ``train`` / ``validation`` / ``test``, using the official lists when they are present."""
    data_dir = Path(data_dir)
    train_val_path, test_path = data_dir / TRAIN_VAL_LIST, data_dir / TEST_LIST
    if not (train_val_path.is_file() and test_path.is_file()):
        return split_by_patient(records, validation_fraction, seed)
    train_val, test = read_image_list(train_val_path), read_image_list(test_path)
    logger.info("Using the official %s / %s for the test split.", TRAIN_VAL_LIST, TEST_LIST)
    patients_in = defaultdict(set)
    for record in records:
        for name, listed in (("train_val", train_val), ("test", test)):
            if record.image in listed:
                patients_in[name].add(record.patient_id)
    shared = patients_in["train_val"] & patients_in["test"]
    if shared:
        logger.warning("%d patients appear in both official lists (e.g. %s); their test images leak.",
                       len(shared), sorted(shared)[:3])
    unlisted = [r.image for r in records if r.image not in train_val and r.image not in test]
    if unlisted:
        logger.warning("%d images are in neither official list and are left out: %s", len(unlisted), listing(unlisted))
    split = split_by_patient([r for r in records if r.image in train_val], validation_fraction, seed)
    split.update({r.image: "test" for r in records if r.image in test})
    return split


def write_metadata(records: list[XrayRecord], split: dict[str, str], images_dir: str | os.PathLike) -> Path:
    """Write ``metadata.jsonl`` beside the images for ``datasets.load_dataset("imagefolder")``.

    Each line: ``file_name``, ``labels`` (N-hot), ``patient_id``, ``finding_labels`` and ``split``.
    """
    path = Path(images_dir) / "metadata.jsonl"
    try:
        with path.open("w", encoding="utf-8") as handle:
            for record in records:
                if record.image in split:
                    handle.write(json.dumps({"file_name": record.image, "labels": list(record.labels),
                                             "patient_id": record.patient_id, "finding_labels": record.finding_labels,
                                             "split": split[record.image]}) + "\n")
    except OSError as err:
        raise OSError(f"Cannot write {path} ({err}); the imagefolder loader needs metadata.jsonl beside the "
                      "images. Copy or link the images to a writable folder and point --chestxray_dir there.") from err
    return path


def prepare_chestxray(data_dir: str | os.PathLike, validation_fraction: float = 0.05, seed: int = 0,
                      skip_missing_images: bool = False, skip_bad_images: bool = False,
                      show_progress: bool = False) -> Path:
    """Check the CSV and the images, split by patient and write ``images/metadata.jsonl``; return it."""
    data_dir = Path(data_dir)
    records = read_label_csv(data_dir / LABEL_FILE)
    records = check_images(records, data_dir / "images", skip_missing_images, skip_bad_images, show_progress)
    split = assign_splits(records, data_dir, validation_fraction, seed)
    counts = defaultdict(int)
    for name in split.values():
        counts[name] += 1
    logger.info("ChestX-ray14 split by patient: %s images", dict(counts))
    return write_metadata(records, split, data_dir / "images")


def load_chestxray(data_dir: str | os.PathLike, validation_fraction: float = 0.05, seed: int = 0,
                   skip_missing_images: bool = False, cache_dir: str | None = None, skip_bad_images: bool = False,
                   show_progress: bool = False):
    """Prepare the folder and load it as a `DatasetDict` with ``train``, ``validation`` (and ``test``).

    Columns: ``image`` (PIL), ``labels`` (14 floats), ``patient_id``, ``finding_labels``. The images
    were checked (`check_images`), so no split holds a file that cannot be trained on.
    """
    import datasets

    metadata = prepare_chestxray(data_dir, validation_fraction, seed, skip_missing_images, skip_bad_images,
                                 show_progress)
    everything = datasets.load_dataset("imagefolder", data_dir=str(metadata.parent), split="train",
                                       cache_dir=cache_dir)
    splits = list(everything["split"])
    result = datasets.DatasetDict()
    for name in ("train", "validation", "test"):
        indices = [i for i, s in enumerate(splits) if s == name]
        if indices:
            result[name] = everything.select(indices).remove_columns("split")
    return result
