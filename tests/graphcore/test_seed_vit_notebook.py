"""Seed 002: the IPU cells of the ViT ChestX-ray14 notebook, with only its `optimum.graphcore` imports.

The notebook's code runs as written for everything IPU-related: `IPUConfig.from_pretrained(
"Graphcore/vit-base-ipu")` (bundled, offline), `IPUTrainingArguments` with the notebook's arguments,
`IPUTrainer` with its arguments (`tokenizer=feature_extractor`, the custom collator), the resume
check, `train`, the log parsing, `evaluate`, `log_metrics` / `save_metrics`. What changes: generated
data instead of the NIH release, a 12-layer tiny ViT (vit-base-ipu places 12 layers), sizes
(gradient accumulation 8 instead of 128, 2 steps, no loader workers), PIL instead of torchvision,
and the metric (the notebook's `datasets.load_metric` is gone from datasets; its softmax over a
multi-label problem is the trap the semantics reference names, so sigmoid + macro ROC AUC here).
"""

import contextlib
import io
import json
import os

import datasets
import numpy as np
import pandas as pd
import torch
import transformers
from fixtures import tiny_image_processor, tiny_vit_model_dir, write_synthetic_chestxray
from sklearn.metrics import roc_auc_score

import optimum.graphcore as optimum_graphcore


def pil_transforms(processor):
    """The notebook's torchvision Compose (RGB, resize, to tensor, normalize) with PIL and numpy."""
    height, width = processor.size["height"], processor.size["width"]
    mean, std = np.array(processor.image_mean)[:, None, None], np.array(processor.image_std)[:, None, None]

    def apply(pil_img):
        array = np.asarray(pil_img.convert("RGB").resize((width, height)), dtype=np.float32) / 255.0
        return torch.tensor(((array.transpose(2, 0, 1) - mean) / std).astype(np.float32))

    return apply


def test_seed_002_vit_notebook_runs_with_the_original_imports(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    dataset_rootdir = write_synthetic_chestxray(tmp_path / "xray", patients=24, max_images_per_patient=4)
    images_dir = dataset_rootdir / "images"
    label_file = dataset_rootdir / "Data_Entry_2017_v2020.csv"

    # --- The notebook's data cells (pandas, N-hot labels, metadata.jsonl, imagefolder) ---
    data = pd.read_csv(label_file)
    unique_labels = np.unique(data["Finding Labels"].str.split("|").aggregate(np.concatenate)).tolist()
    label_index = {v: i for i, v in enumerate(unique_labels)}

    def string_to_N_hot(string: str):
        true_index = [label_index[cl] for cl in string.split("|")]
        label = np.zeros((len(unique_labels),), dtype=float)
        label[true_index] = 1
        return label

    data["labels"] = data["Finding Labels"].apply(string_to_N_hot)
    data[["Image Index", "labels"]].rename(columns={"Image Index": "file_name"}).to_json(
        images_dir / "metadata.jsonl", orient="records", lines=True
    )
    train_val_split = 0.1  # notebook: 0.05 of 112,120 images; here a validation set of at least one call of 4
    dataset = datasets.load_dataset("imagefolder", data_dir=images_dir)
    split = dataset["train"].train_test_split(train_val_split, seed=0)
    dataset["train"] = split["train"]
    dataset["validation"] = split["test"]

    model_name_or_path = str(
        tiny_vit_model_dir(tmp_path / "vit", num_hidden_layers=12, num_labels=len(unique_labels))
    )
    tiny_image_processor().save_pretrained(model_name_or_path)
    feature_extractor = transformers.AutoImageProcessor.from_pretrained(model_name_or_path)
    to_pixels = pil_transforms(feature_extractor)

    class XRayTransform:
        def __call__(self, example_batch):
            example_batch["pixel_values"] = [to_pixels(pil_img) for pil_img in example_batch["image"]]
            return example_batch

    dataset["train"].set_transform(XRayTransform())
    dataset["validation"].set_transform(XRayTransform())

    def batch_sampler(examples):
        pixel_values = torch.stack([example["pixel_values"] for example in examples])
        labels = torch.tensor([example["labels"] for example in examples])
        return {"pixel_values": pixel_values, "labels": labels}

    model = transformers.AutoModelForImageClassification.from_pretrained(
        model_name_or_path, num_labels=len(unique_labels)
    )

    # --- The IPU cells, as in the notebook ---
    ipu_config = optimum_graphcore.IPUConfig.from_pretrained("Graphcore/vit-base-ipu")
    training_args = optimum_graphcore.IPUTrainingArguments(
        output_dir="./results",
        overwrite_output_dir=True,
        per_device_train_batch_size=1,
        per_device_eval_batch_size=1,
        dataloader_num_workers=0,  # notebook: 8
        dataloader_drop_last=True,
        num_train_epochs=3,
        max_steps=2,  # added: 2 combined batches
        gradient_accumulation_steps=8,  # added: the config's 128 would need 128 images per step
        seed=1337,
        logging_steps=1,  # notebook: 50
        save_steps=1000,
        remove_unused_columns=False,
        warmup_ratio=0.25,
        lr_scheduler_type="cosine",
        learning_rate=2e-4,
        ignore_data_skip=True,
    )

    def compute_metrics(p):
        scores = 1 / (1 + np.exp(-p.predictions.astype("float32")))
        present = [k for k in range(p.label_ids.shape[1]) if 0 < p.label_ids[:, k].sum() < len(p.label_ids)]
        auc = roc_auc_score(p.label_ids[:, present], scores[:, present], average="macro") if present else 0.5
        return {"roc_auc": auc}

    with caplog.at_level("INFO"):
        trainer = optimum_graphcore.IPUTrainer(
            model=model,
            ipu_config=ipu_config,
            args=training_args,
            train_dataset=dataset["train"],
            eval_dataset=dataset["validation"],
            compute_metrics=compute_metrics,
            tokenizer=feature_extractor,
            data_collator=batch_sampler,
        )
    assert "Encoder 11 --> IPU 3" in caplog.text.replace("  ", " ")  # the notebook's Device Allocation

    last_checkpoint = None
    if os.path.isdir(training_args.output_dir) and not training_args.overwrite_output_dir:
        last_checkpoint = transformers.trainer_utils.get_last_checkpoint(training_args.output_dir)

    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        trainer.train(resume_from_checkpoint=last_checkpoint)

    values = []
    for line in output.getvalue().split("\n"):
        if len(line) > 3 and line[:3] == "{'l":
            values.append(json.loads(line.replace("'", '"')))
    training_records = pd.DataFrame(values)
    assert len(training_records) == 2 and np.isfinite(training_records["loss"].astype(float)).all()
    assert trainer.state.global_step == 2
    assert trainer.ipu_config.ipus_per_replica == 4 and trainer.ipu_config.gradient_accumulation_steps == 8

    metrics = trainer.evaluate()
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    assert np.isfinite(metrics["eval_loss"]) and 0 <= metrics["eval_roc_auc"] <= 1
    assert (
        json.loads((tmp_path / "results" / "eval_results.json").read_text())["eval_loss"]
        == metrics["eval_loss"]
    )
