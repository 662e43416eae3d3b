"""examples/image-classification/run_image_classification.py end to end on tiny ViTs and generated data.

The ChestX-ray14 path runs in a subprocess, as a user runs it; the model-from-config path, the
single-label imagefolder path and the input errors call `main` in-process.
"""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from fixtures import IMAGE_EXAMPLE_DIR, tiny_vit_model_dir, use_example, write_synthetic_chestxray
from PIL import Image

use_example(IMAGE_EXAMPLE_DIR)
import run_image_classification as run_ic  # noqa: E402  (on sys.path only now)

# A 4-layer model on Graphcore/vit-base-ipu (published for 12 layers as [3,3,3,3]), 16 images per step.
IPU_FLAGS = [
    "--ipu_config_name", "Graphcore/vit-base-ipu", "--ipu_config_overrides", "layers_per_ipu=[1 1 1 1]",
    "--gradient_accumulation_steps", "8", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "4",
    "--save_strategy", "no", "--report_to", "none", "--dataloader_num_workers", "0",
]  # fmt: skip


@pytest.fixture(scope="module")
def chestxray(tmp_path_factory):
    return write_synthetic_chestxray(
        tmp_path_factory.mktemp("cxr") / "data", patients=24, image_size=32, test_fraction=0.2
    )


def run_main(argv, tmp_path):
    return run_ic.main([*argv, "--output_dir", str(tmp_path / "out"), "--overwrite_output_dir"])


def test_chestxray_multilabel_run_end_to_end(chestxray, tmp_path):
    model = tiny_vit_model_dir(tmp_path / "vit", num_labels=14)
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "cache")
    )
    command = [sys.executable, str(IMAGE_EXAMPLE_DIR / "run_image_classification.py"),
               "--chestxray_dir", str(chestxray), "--train_val_split", "0.25", "--model_name_or_path", str(model),
               "--image_processor_name", str(model), *IPU_FLAGS, "--do_train", "--do_eval", "--do_predict",
               "--max_steps", "3", "--logging_steps", "1", "--warmup_ratio", "0.25", "--loss_scaling", "64",
               "--output_dir", str(tmp_path / "out")]  # fmt: skip
    (model / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "ViTImageProcessor",
                "size": {"height": 32, "width": 32},
                "image_mean": [0.5] * 3,
                "image_std": [0.5] * 3,
                "do_resize": True,
                "do_normalize": True,
            }
        )
    )
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    out = tmp_path / "out"
    results = json.loads((out / "all_results.json").read_text())
    assert results["train_steps"] == 3
    assert 0.0 <= results["eval_roc_auc"] <= 1.0 and "eval_roc_auc_Pneumothorax" in results
    assert "test_roc_auc" in results  # the official-style test_list.txt became the test split
    config = json.loads((out / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification" and len(config["id2label"]) == 14
    assert (out / "training_curves.png").stat().st_size > 0 and (out / "roc_auc_per_finding.png").is_file()
    assert (chestxray / "images" / "metadata.jsonl").is_file()


def test_vit_built_from_a_config_without_weights(chestxray, tmp_path):
    metrics = run_main(["--chestxray_dir", str(chestxray), "--model_type", "vit", "--model_config_overrides",
                        "image_size=32,patch_size=8,hidden_size=32,num_hidden_layers=4,num_attention_heads=4,"
                        "intermediate_size=64", *IPU_FLAGS, "--do_train", "--do_eval", "--max_steps", "1",
                        "--fp32", "--train_val_split", "0.25", "--evaluate_before_training"], tmp_path)  # fmt: skip
    assert metrics["train_steps"] == 1 and "eval_roc_auc" in metrics
    assert "untrained_roc_auc" in metrics  # the score before training, to compare with
    saved = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert saved["untrained_roc_auc"] == metrics["untrained_roc_auc"]
    processor = json.loads((tmp_path / "out" / "preprocessor_config.json").read_text())
    assert processor["size"] == {"height": 32, "width": 32}


def test_single_label_imagefolder(tmp_path):
    rng = np.random.default_rng(0)
    for split, count in (("train", 12), ("val", 6)):
        for label, level in (("dark", 40), ("light", 200)):
            folder = tmp_path / split / label
            folder.mkdir(parents=True)
            for n in range(count):
                pixels = np.clip(level + rng.normal(0, 10, (20, 20)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{n}.png")
    model = tiny_vit_model_dir(tmp_path / "vit", num_labels=2)
    metrics = run_main(
        [
            "--train_dir",
            str(tmp_path / "train"),
            "--validation_dir",
            str(tmp_path / "val"),
            "--model_name_or_path",
            str(model),
            *IPU_FLAGS,
            "--do_train",
            "--do_eval",
            "--max_steps",
            "1",
            "--fp32",
        ],
        tmp_path,
    )  # no preprocessor_config.json: ViT defaults
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0 and metrics["eval_samples"] == 12
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["id2label"] == {"0": "dark", "1": "light"}


@pytest.fixture
def vit_with_processor(tmp_path):
    return tiny_vit_model_dir(tmp_path / "vit", num_labels=14)


def _copy_without(chestxray, tmp_path, drop_image=None, bad_label=None):
    """A copy of the synthetic folder's CSV (images linked) with one image missing or one label wrong."""
    root = tmp_path / "copy"
    (root / "images").mkdir(parents=True)
    for image in (chestxray / "images").glob("*.png"):
        if image.name != drop_image:
            os.symlink(image, root / "images" / image.name)
    with open(chestxray / "Data_Entry_2017_v2020.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    if bad_label:
        rows[1]["Finding Labels"] = bad_label
    with open(root / "Data_Entry_2017_v2020.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return root, rows


def test_missing_image_is_a_clear_error_and_can_be_skipped(chestxray, tmp_path, vit_with_processor):
    root, rows = _copy_without(chestxray, tmp_path, drop_image="00000002_000.png")
    args = [
        "--chestxray_dir",
        str(root),
        "--model_name_or_path",
        str(vit_with_processor),
        *IPU_FLAGS,
        "--do_eval",
    ]
    with pytest.raises(FileNotFoundError, match=r"00000002_000.png.*--skip_missing_images"):
        run_main(args, tmp_path)
    metrics = run_main([*args, "--skip_missing_images"], tmp_path)
    assert metrics["eval_samples"] > 0


def test_unknown_finding_label_is_a_clear_error(chestxray, tmp_path, vit_with_processor):
    root, _ = _copy_without(chestxray, tmp_path, bad_label="Mass|Pnuemonia")
    with pytest.raises(ValueError, match=r"line 3 .*Unknown finding label\(s\) \['Pnuemonia'\]"):
        run_main(
            [
                "--chestxray_dir",
                str(root),
                "--model_name_or_path",
                str(vit_with_processor),
                *IPU_FLAGS,
                "--do_eval",
            ],
            tmp_path,
        )


def test_exactly_one_data_source():
    with pytest.raises(ValueError, match="exactly one data source"):
        run_ic.parse_arguments(["--output_dir", "o"])
    with pytest.raises(ValueError, match="exactly one data source"):
        run_ic.parse_arguments(["--output_dir", "o", "--chestxray_dir", "a", "--train_dir", "b"])
