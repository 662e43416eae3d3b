"""ChestX-ray14 handling (examples/image-classification/chestxray.py) and its synthetic generator."""

import csv
import json
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
from fixtures import IMAGE_EXAMPLE_DIR, use_example, write_synthetic_chestxray
from PIL import Image

use_example(IMAGE_EXAMPLE_DIR)
from chestxray import (  # noqa: E402
    CSV_COLUMNS,
    FINDINGS,
    LABEL_FILE,
    assign_splits,
    check_images,
    decode_labels,
    load_chestxray,
    n_hot,
    prepare_chestxray,
    read_label_csv,
    split_by_patient,
)


def write_csv(path, rows, columns=CSV_COLUMNS):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c, "0") for c in columns})


def row(image, labels, patient):
    return {"Image Index": image, "Finding Labels": labels, "Patient ID": patient}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return write_synthetic_chestxray(tmp_path_factory.mktemp("cxr") / "data", patients=20, image_size=32)


def test_n_hot_covers_the_14_findings_and_no_finding_is_all_zero():
    vector = n_hot("Effusion|Mass")
    assert len(vector) == 14 == len(FINDINGS)
    assert [FINDINGS[i] for i, v in enumerate(vector) if v] == ["Effusion", "Mass"]
    assert n_hot("No Finding") == [0.0] * 14
    assert decode_labels(n_hot("Pleural_Thickening|Hernia")) == "Hernia|Pleural_Thickening"
    assert decode_labels([0.0] * 14) == "No Finding"


def test_bad_finding_labels_are_explained():
    with pytest.raises(
        ValueError, match=r"Unknown finding label\(s\) \['Pleural Thickening'\].*Pleural_Thickening"
    ):
        n_hot("Pleural Thickening")
    with pytest.raises(ValueError, match="combines 'No Finding' with findings"):
        n_hot("No Finding|Mass")
    with pytest.raises(ValueError, match="Empty `Finding Labels`"):
        n_hot("")


def test_missing_csv_columns_are_named_with_the_expected_header(tmp_path):
    path = tmp_path / "BBox_List_2017.csv"
    write_csv(path, [{"Image Index": "a.png"}], columns=["Image Index", "Finding Label", "Bbox [x"])
    with pytest.raises(ValueError) as error:
        read_label_csv(path)
    assert "['Finding Labels', 'Patient ID']" in str(error.value)
    assert "OriginalImagePixelSpacing[x" in str(error.value)


def test_every_row_with_an_unknown_label_is_reported(tmp_path):
    path = tmp_path / LABEL_FILE
    write_csv(path, [row("a.png", "Mass", 1), row("b.png", "Cancer", 1), row("c.png", "Nodule|Flu", 2)])
    with pytest.raises(ValueError) as error:
        read_label_csv(path)
    message = str(error.value)
    assert "2 row(s)" in message and "line 3 (b.png)" in message and "line 4 (c.png)" in message


def test_duplicate_images_are_rejected(tmp_path):
    path = tmp_path / LABEL_FILE
    write_csv(path, [row("a.png", "Mass", 1), row("a.png", "Mass", 1)])
    with pytest.raises(ValueError, match="lists 1 image.*twice: a.png"):
        read_label_csv(path)


def test_missing_and_unreadable_images_fail_with_the_fix(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(images / "a.png")
    (images / "broken.png").write_text("not a png")
    path = tmp_path / LABEL_FILE
    write_csv(path, [row("a.png", "Mass", 1), row("gone.png", "No Finding", 2), row("broken.png", "Mass", 3)])
    records = read_label_csv(path)
    with pytest.raises(FileNotFoundError, match=r"1 of 3 images .* gone.png.*--skip_missing_images"):
        check_images(records, images)
    with pytest.raises(
        ValueError, match=r"cannot be trained on: broken.png \(not an image.*--skip_bad_images"
    ):
        check_images(records, images, skip_missing=True)
    kept = check_images(records[:2], images, skip_missing=True)
    assert [r.image for r in kept] == ["a.png"]
    kept = check_images(records, images, skip_missing=True, skip_bad=True)
    assert [r.image for r in kept] == ["a.png"]


def test_patient_split_never_shares_a_patient(synthetic):
    records = read_label_csv(synthetic / LABEL_FILE)
    split = split_by_patient(records, 0.25, seed=1)
    patients = defaultdict(set)
    for record in records:
        patients[split[record.image]].add(record.patient_id)
    assert patients["train"] and patients["validation"]
    assert not patients["train"] & patients["validation"]
    share = sum(s == "validation" for s in split.values()) / len(split)
    assert 0.25 <= share < 0.5  # at least the fraction, overshooting by at most one patient's images
    assert split == split_by_patient(records, 0.25, seed=1)  # deterministic


def test_several_images_per_patient_so_an_image_split_would_leak(synthetic):
    records = read_label_csv(synthetic / LABEL_FILE)
    per_patient = defaultdict(int)
    for record in records:
        per_patient[record.patient_id] += 1
    assert max(per_patient.values()) > 1


def test_official_lists_give_the_test_split(tmp_path):
    root = write_synthetic_chestxray(tmp_path / "data", patients=20, image_size=32, test_fraction=0.25)
    records = read_label_csv(root / LABEL_FILE)
    split = assign_splits(records, root, 0.2, seed=0)
    test_list = set((root / "test_list.txt").read_text().split())
    assert {image for image, s in split.items() if s == "test"} == test_list
    by_split = defaultdict(set)
    for record in records:
        by_split[split[record.image]].add(record.patient_id)
    assert not by_split["train"] & by_split["validation"] and not by_split["test"] & by_split["train"]


def test_metadata_and_imagefolder_loading(synthetic, tmp_path):
    metadata = prepare_chestxray(synthetic, 0.2, seed=0)
    lines = [json.loads(line) for line in metadata.read_text().splitlines()]
    assert set(lines[0]) == {"file_name", "labels", "patient_id", "finding_labels", "split"}
    assert all(line["labels"] == n_hot(line["finding_labels"]) for line in lines)

    data = load_chestxray(synthetic, 0.2, seed=0, cache_dir=str(tmp_path / "cache"))
    assert set(data) == {"train", "validation"}
    assert len(data["train"]) + len(data["validation"]) == len(lines)
    assert not set(data["train"]["patient_id"]) & set(data["validation"]["patient_id"])
    example = data["validation"][0]
    assert example["image"].mode == "L" and len(example["labels"]) == 14


def test_generator_writes_the_real_csv_columns_and_grayscale_images(synthetic):
    with open(synthetic / LABEL_FILE, newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    assert tuple(reader.fieldnames) == CSV_COLUMNS
    first = rows[0]
    assert first["Image Index"] == f"{int(first['Patient ID']):08d}_{int(first['Follow-up #']):03d}.png"
    assert {r["View Position"] for r in rows} <= {"PA", "AP"} and {r["Patient Gender"] for r in rows} <= {
        "M",
        "F",
    }
    image = Image.open(synthetic / "images" / first["Image Index"])
    assert image.mode == "L" and image.size == (32, 32)
    labelled = [r["Finding Labels"] for r in rows]
    assert "No Finding" in labelled and any("|" in labels for labels in labelled)


def test_findings_follow_the_real_prevalences_by_default():
    import random

    from make_synthetic_chestxray import REAL_PREVALENCE, prevalences, sample_patient_findings

    chance = prevalences(None)
    assert chance == [REAL_PREVALENCE[name] for name in FINDINGS] and prevalences(0.3) == [0.3] * 14
    rng = random.Random(0)
    images = [f for _ in range(20000) for f in sample_patient_findings(rng, 1, chance)]
    rate = np.mean([[k in f for k in range(14)] for f in images], axis=0)
    # An image shows finding k with about 0.8 p (chronic) + p / 4 (new): ~1.05 p.
    assert np.allclose(rate, 1.05 * np.array(chance), rtol=0.25, atol=0.002), rate
    assert rate[FINDINGS.index("Infiltration")] > 10 * rate[FINDINGS.index("Hernia")]


def test_label_noise_drops_and_adds_findings_at_the_asked_rates():
    import random

    from make_synthetic_chestxray import noisy_labels

    rng, chance = random.Random(0), [0.1] * 14
    drawn = list(range(7))
    kept = [noisy_labels(rng, drawn, chance, 0.2) for _ in range(5000)]
    missed = np.mean([[k not in labels for k in drawn] for labels in kept])
    added = np.mean([[k in labels for k in range(7, 14)] for labels in kept])
    assert abs(missed - 0.2) < 0.02 and abs(added - 0.2 * 0.1) < 0.005
    assert noisy_labels(rng, drawn, chance, 0.0) == drawn


def test_hard_findings_are_faint_and_overlap_their_neighbours_easy_ones_do_not():
    from make_synthetic_chestxray import EASY, HARD, draw_xray

    def footprint(kinds, difficulty):
        quiet = replace(difficulty, noise=0.0)
        blank = draw_xray([], 64, np.random.default_rng(0), quiet).astype(float)
        drawn = draw_xray(kinds, 64, np.random.default_rng(0), quiet).astype(float)
        return np.abs(drawn - blank)

    for difficulty, overlaps in ((HARD, True), (EASY, False)):
        both = (footprint([0], difficulty) > 0) & (footprint([1], difficulty) > 0)  # neighbours in the grid
        assert both.any() == overlaps
    assert footprint([7], HARD).max() < 0.5 * footprint([7], EASY).max()
    assert HARD.noise > EASY.noise and HARD.label_noise > 0 == EASY.label_noise


def test_generator_command_line_easy_switch(tmp_path):
    from make_synthetic_chestxray import main

    assert (
        main(["--output_dir", str(tmp_path / "easy"), "--patients", "6", "--image_size", "32", "--easy"]) == 0
    )
    with open(tmp_path / "easy" / LABEL_FILE, newline="") as handle:
        assert len(list(csv.DictReader(handle))) >= 6
    with pytest.raises(SystemExit):
        main(["--output_dir", str(tmp_path / "bad"), "--label_noise", "1.5"])
