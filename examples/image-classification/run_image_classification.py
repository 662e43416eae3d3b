#!/usr/bin/env python
"""Fine-tune (or train from a config) a ViT image classifier on a simulated IPU.

Three kinds of data:

* ``--chestxray_dir DIR``: NIH ChestX-ray14 (``DIR/images/*.png`` and ``DIR/Data_Entry_2017_v2020.csv``),
  a multi-label problem over 14 findings: N-hot labels, split by patient, ``problem_type=
  "multi_label_classification"`` (sigmoid + binary cross-entropy), per-finding and macro ROC AUC;
* ``--dataset_name`` (a Hub data set with an ``image`` and a class ``label`` column, e.g. beans);
* ``--train_dir`` / ``--validation_dir``: an ``imagefolder`` with one sub-folder per class.

Graphcore's walkthrough setting::

    python run_image_classification.py --chestxray_dir data/chestxray \\
        --model_name_or_path google/vit-base-patch16-224-in21k --ipu_config_name Graphcore/vit-base-ipu \\
        --do_train --do_eval --num_train_epochs 3 --learning_rate 2e-4 --warmup_ratio 0.25 \\
        --lr_scheduler_type cosine --per_device_train_batch_size 1 --output_dir chestxray_vit

Without weights, ``--model_type vit --model_config_overrides "hidden_size=64,..."`` (or
``--config_name``) builds a randomly initialised model. Plots (training loss and learning rate, and
per-finding AUC bars) are written to the output folder.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass, field

import transformers
from image_data import LabelSpace, load_data, select_splits
from image_metrics import accuracy, multilabel_roc_auc
from image_transforms import ImageTransform, collate_images
from plots import auc_bars, training_curves
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModelForImageClassification,
    EvalPrediction,
    HfArgumentParser,
    ViTImageProcessorPil,
    set_seed,
)

from optimum_ipu import IPUTrainer, IPUTrainingArguments, get_last_checkpoint
from optimum_ipu.training_args import resolve_ipu_config

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "google/vit-base-patch16-224-in21k"
DEFAULT_IPU_CONFIG = "Graphcore/vit-base-ipu"


@dataclass
class ModelArguments:
    """Which model to fine-tune, or which config to build one from."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": f"Model folder or Hub id; default {DEFAULT_MODEL} unless --config_name/--model_type "
                  "ask for a model built from a config (random weights)."},
    )
    model_type: str | None = field(default=None, metadata={"help": "Build a fresh model of this type, e.g. vit."})
    config_name: str | None = field(default=None, metadata={"help": "Config name or path, if not the model's."})
    model_config_overrides: str | None = field(
        default=None, metadata={"help": "Config changes, 'key=value,...', e.g. 'hidden_size=64,num_hidden_layers=4'."}
    )
    image_processor_name: str | None = field(default=None, metadata={"help": "Image processor name or path."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where Hub downloads are cached."})
    model_revision: str = field(default="main", metadata={"help": "Hub revision: branch, tag or commit."})
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Re-initialise a pretrained head whose size differs from the labels'."}
    )

    def __post_init__(self):
        if self.model_name_or_path is None and self.config_name is None and self.model_type is None:
            self.model_name_or_path = DEFAULT_MODEL


@dataclass
class DataTrainingArguments:
    """What images to train and evaluate on."""

    chestxray_dir: str | None = field(
        default=None, metadata={"help": "ChestX-ray14 folder: images/ and Data_Entry_2017_v2020.csv."}
    )
    dataset_name: str | None = field(default=None, metadata={"help": "Hub data set (image + class label)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of the Hub data set."})
    train_dir: str | None = field(default=None, metadata={"help": "imagefolder of training images, a folder per class."})
    validation_dir: str | None = field(default=None, metadata={"help": "imagefolder of validation images."})
    train_val_split: float | None = field(
        default=None,
        metadata={"help": "Share held out for validation when there is no validation split "
                  "(default: 0.05 of ChestX-ray14 images, by patient; else 0.15)."},
    )
    skip_missing_images: bool = field(
        default=False, metadata={"help": "ChestX-ray14: skip CSV rows whose image is absent instead of failing."}
    )
    skip_bad_images: bool = field(
        default=False,
        metadata={"help": "Train without the images the check before training rejects (empty, truncated, not an "
                  "image, 16-bit), logging their count and names, instead of failing."},
    )
    image_column_name: str = field(default="image", metadata={"help": "Column holding the images."})
    label_column_name: str = field(default="label", metadata={"help": "Column holding class labels (single-label)."})
    random_crop_min_scale: float | None = field(
        default=None, metadata={"help": "Training augmentation: random crop keeping at least this share of the area."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Truncate the training set."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Truncate the evaluation set."})
    evaluate_before_training: bool = field(
        default=False,
        metadata={"help": "With --do_train --do_eval, also evaluate the model as loaded, before training: its "
                  "scores are logged and saved with the prefix untrained_ (what training bought)."},
    )

    def __post_init__(self):
        sources = [bool(self.chestxray_dir), bool(self.dataset_name), bool(self.train_dir)]
        if sum(sources) != 1:
            raise ValueError("Give exactly one data source: --chestxray_dir, --dataset_name or --train_dir.")
        for flag in ("chestxray_dir", "train_dir", "validation_dir"):
            path = getattr(self, flag)
            if path and not os.path.isdir(path):
                holds = ("images/ and Data_Entry_2017_v2020.csv" if flag == "chestxray_dir"
                         else "one sub-folder of images per class")
                raise FileNotFoundError(f"--{flag} {path}: no such folder. Give the folder that holds {holds}.")
        if self.skip_missing_images and not self.chestxray_dir:
            logger.warning("--skip_missing_images has no effect without --chestxray_dir (only its CSV can list an "
                           "image that is absent); --skip_bad_images skips unusable files of any source.")
        if self.train_val_split is not None and not 0 < self.train_val_split < 1:
            raise ValueError(f"--train_val_split is a share of the data, between 0 and 1; got {self.train_val_split}.")
        if self.random_crop_min_scale is not None and not 0 < self.random_crop_min_scale <= 1:
            raise ValueError(f"--random_crop_min_scale must be in (0, 1], got {self.random_crop_min_scale}.")
        for flag in ("max_train_samples", "max_eval_samples"):
            value = getattr(self, flag)
            if value is not None and value < 1:
                raise ValueError(f"--{flag} must be >= 1, got {value}.")


def parse_arguments(argv: list[str] | None = None):
    """Parse the command line (or one .json file of arguments) into the three argument dataclasses."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, IPUTrainingArguments))
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    return parser.parse_args_into_dataclasses(args=argv)


def from_pretrained(loader, name: str, what: str, **kwargs):
    """``loader.from_pretrained(name)``, with an error that names the input when it cannot be found."""
    try:
        return loader.from_pretrained(name, **kwargs)
    except OSError as error:
        raise OSError(f"Cannot load the {what} {name!r}: {error}\nGive a local folder or an existing Hub id; "
                      "offline (HF_HUB_OFFLINE=1), a Hub id must already be in the Hugging Face cache.") from error


def build_model(model_args: ModelArguments, labels: LabelSpace):
    """The classifier, from pretrained weights or (``--model_type`` / ``--config_name``) from a config."""
    label_config = dict(
        num_labels=len(labels.names),
        id2label=dict(enumerate(labels.names)),
        label2id={name: i for i, name in enumerate(labels.names)},
        problem_type="multi_label_classification" if labels.multi_label else "single_label_classification",
    )
    hub = dict(cache_dir=model_args.cache_dir, revision=model_args.model_revision)
    if model_args.config_name or model_args.model_name_or_path:
        config = from_pretrained(AutoConfig, model_args.config_name or model_args.model_name_or_path, "config",
                                 **label_config, **hub)
    else:
        config = AutoConfig.for_model(model_args.model_type, **label_config)
    if model_args.model_config_overrides:
        config.update_from_string(model_args.model_config_overrides)
    if model_args.model_name_or_path:
        model = AutoModelForImageClassification.from_pretrained(
            model_args.model_name_or_path, config=config, ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
            **hub)
    else:
        logger.warning("No --model_name_or_path: training a randomly initialised %s from its config.", config.model_type)
        model = AutoModelForImageClassification.from_config(config)
    return model


def build_image_processor(model_args: ModelArguments, config):
    """The model's image processor; a ViT one of the config's input size when the model has none.

    Models built from a config, and checkpoints saved without ``preprocessor_config.json``, get
    ViT's usual preprocessing: resize to ``config.image_size``, mean and std 0.5 per channel.
    """
    name = model_args.image_processor_name or model_args.model_name_or_path
    if name:
        hub = dict(cache_dir=model_args.cache_dir, revision=model_args.model_revision)
        try:
            try:
                return AutoImageProcessor.from_pretrained(name, **hub)
            except ImportError:
                # Older transformers (5.9) pick the torchvision class for a ViT; this project never needs
                # torchvision, so read the same file with the PIL one.
                return ViTImageProcessorPil.from_pretrained(name, **hub)
        except OSError:
            if model_args.image_processor_name:
                raise
            logger.warning("%s has no image processor; using ViT's defaults at %s px.", name,
                           getattr(config, "image_size", 224))
    size = getattr(config, "image_size", 224)
    return ViTImageProcessorPil(size={"height": size, "width": size}, image_mean=[0.5] * 3, image_std=[0.5] * 3)


def processor_size(image_processor) -> tuple[int, int]:
    """(height, width) the processor resizes to; a ``shortest_edge`` size becomes a square."""
    size = image_processor.size
    if "height" in size:
        return size["height"], size["width"]
    return size["shortest_edge"], size["shortest_edge"]


def make_compute_metrics(labels: LabelSpace):
    """Macro/per-finding ROC AUC on sigmoid scores (multi-label) or accuracy (single-label)."""

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        if labels.multi_label:
            return multilabel_roc_auc(logits, prediction.label_ids, labels.names)
        return accuracy(logits, prediction.label_ids)

    return compute_metrics


def write_plots(trainer, metrics: dict[str, float], labels: LabelSpace, output_dir: str) -> list[str]:
    """Training curves, and per-finding AUC bars after a multi-label evaluation."""
    if not trainer.is_world_process_zero():
        return []
    os.makedirs(output_dir, exist_ok=True)
    written = [training_curves(trainer.state.log_history, output_dir)]
    per_finding = {n: metrics.get(f"eval_roc_auc_{n}", math.nan) for n in labels.names}
    if labels.multi_label and "eval_roc_auc" in metrics:
        written.append(auc_bars({n: v for n, v in per_finding.items() if not math.isnan(v)},
                                metrics["eval_roc_auc"], output_dir))
    return [path for path in written if path]


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run training / evaluation / prediction as the arguments ask; return all metrics."""
    model_args, data_args, training_args = parse_arguments(argv)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        handlers=[logging.StreamHandler(sys.stdout)])
    level = training_args.get_process_log_level()
    logger.setLevel(level)
    transformers.utils.logging.set_verbosity(level)
    # set_transform produces pixel_values from the image column, which the Trainer must not drop first.
    training_args.remove_unused_columns = False
    set_seed(training_args.seed)

    show_progress = training_args.local_process_index == 0 and not training_args.disable_tqdm
    data, labels = load_data(data_args, model_args.cache_dir, training_args.seed, show_progress)
    splits = select_splits(data, labels, data_args, training_args, show_progress)  # before the model: fail fast
    model = build_model(model_args, labels)
    image_processor = build_image_processor(model_args, model.config)
    height_width = processor_size(image_processor)
    common = dict(mean=image_processor.image_mean, std=image_processor.image_std,
                  image_column=data_args.image_column_name, label_column=labels.label_column)
    crop = (data_args.random_crop_min_scale, 1.0) if data_args.random_crop_min_scale else None
    train_set, eval_set, test_set = (splits.get(name) for name in ("train", "validation", "test"))
    if train_set is not None:
        train_set.set_transform(ImageTransform(height_width, random_crop_scale=crop, seed=training_args.seed, **common))
    for split in (eval_set, test_set):
        if split is not None:
            split.set_transform(ImageTransform(height_width, **common))

    if training_args.ipu_config_name is None and not model_args.model_name_or_path:
        training_args.ipu_config_name = DEFAULT_IPU_CONFIG
    ipu_config = resolve_ipu_config(training_args, model_args.model_name_or_path)
    trainer = IPUTrainer(model, ipu_config, args=training_args, train_dataset=train_set, eval_dataset=eval_set,
                         processing_class=image_processor, data_collator=collate_images,
                         compute_metrics=make_compute_metrics(labels))

    all_metrics: dict[str, float] = {}
    if training_args.do_train and training_args.do_eval and data_args.evaluate_before_training:
        metrics = dict(trainer.evaluate(metric_key_prefix="untrained"))
        trainer.log_metrics("untrained", metrics)
        trainer.save_metrics("untrained", metrics)
        all_metrics.update(metrics)
    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint
        if checkpoint is None and os.path.isdir(training_args.output_dir) and not training_args.overwrite_output_dir:
            checkpoint = get_last_checkpoint(training_args.output_dir, save_only_model=training_args.save_only_model)
        result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()
        metrics = dict(result.metrics, train_samples=len(train_set), train_steps=result.global_step)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        all_metrics.update(metrics)
    if training_args.do_eval:
        metrics = dict(trainer.evaluate(), eval_samples=len(eval_set))
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        all_metrics.update(metrics)
    if test_set is not None:
        output = trainer.predict(test_set, metric_key_prefix="test")
        trainer.log_metrics("test", output.metrics)
        trainer.save_metrics("test", output.metrics)
        all_metrics.update(output.metrics)
    for path in write_plots(trainer, all_metrics, labels, training_args.output_dir):
        logger.info("Wrote %s", path)
    return all_metrics


if __name__ == "__main__":
    main()
