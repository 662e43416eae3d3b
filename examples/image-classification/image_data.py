"""Loading the images a run trains on, and checking the splits it reads before the first step.

Three sources (``--chestxray_dir``, ``--dataset_name``, ``--train_dir`` / ``--validation_dir``) end as
a `DatasetDict` and a `LabelSpace`; `select_splits` keeps the splits the run reads and checks them
(rows, images, labels; see `image_checks`), so bad data fails before the model is even built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import datasets
from chestxray import FINDINGS, load_chestxray
from image_checks import check_class_labels, keep_good_images, require_rows, undecoded

if TYPE_CHECKING:
    from run_image_classification import DataTrainingArguments

logger = logging.getLogger(__name__)


@dataclass
class LabelSpace:
    """The labels a data set has: names and whether several can be true at once."""

    names: list[str]
    multi_label: bool
    label_column: str


def _truncate(dataset: datasets.Dataset, limit: int | None) -> datasets.Dataset:
    return dataset.select(range(min(limit, len(dataset)))) if limit is not None else dataset


def data_source(data_args: DataTrainingArguments) -> str:
    """The data source as the user gave it, for error messages."""
    if data_args.chestxray_dir:
        return f"--chestxray_dir {data_args.chestxray_dir}"
    if data_args.dataset_name:
        return f"--dataset_name {data_args.dataset_name}"
    return f"--train_dir {data_args.train_dir}"


def _image_folder(flag: str, folder: str, cache_dir: str | None) -> datasets.Dataset:
    try:
        return datasets.load_dataset("imagefolder", data_dir=folder, split="train", cache_dir=cache_dir)
    except FileNotFoundError as error:  # datasets' EmptyDatasetError
        raise FileNotFoundError(f"--{flag} {folder} holds no images ({error}); put the images in one sub-folder per "
                         f"class, e.g. {folder}/cat/1.jpg and {folder}/dog/2.jpg.") from error


def _hub_data_set(data_args: DataTrainingArguments, cache_dir: str | None) -> datasets.DatasetDict:
    try:
        return datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name, cache_dir=cache_dir)
    except (ConnectionError, FileNotFoundError) as error:  # offline, or no such data set
        raise OSError(f"Cannot load --dataset_name {data_args.dataset_name!r} ({error}). Give a Hub data set id "
                         "or a local folder of data files; offline (HF_DATASETS_OFFLINE=1), a Hub data set must "
                         "already be in the Hugging Face cache.") from error


def load_data(data_args: DataTrainingArguments, cache_dir: str | None, seed: int, show_progress: bool = False):
    """The data set by split and its label space; a validation split is carved out when absent."""
    source = data_source(data_args)
    if data_args.chestxray_dir:
        fraction = data_args.train_val_split if data_args.train_val_split is not None else 0.05
        data = load_chestxray(data_args.chestxray_dir, fraction, seed, data_args.skip_missing_images, cache_dir,
                              data_args.skip_bad_images, show_progress)
        return data, LabelSpace(list(FINDINGS), True, "labels")
    if data_args.dataset_name:
        data = _hub_data_set(data_args, cache_dir)
    else:
        data = datasets.DatasetDict({"train": _image_folder("train_dir", data_args.train_dir, cache_dir)})
        if data_args.validation_dir:
            data["validation"] = _image_folder("validation_dir", data_args.validation_dir, cache_dir)
    if "validation" not in data and "train" in data:
        fraction = data_args.train_val_split if data_args.train_val_split is not None else 0.15
        if len(data["train"]) < 2:
            raise ValueError(f"The train split of {source} has {len(data['train'])} image(s): too few to hold out "
                             "a validation share. Add images, or give a validation split (--validation_dir).")
        parts = data["train"].train_test_split(test_size=fraction, seed=seed)
        data["train"], data["validation"] = parts["train"], parts["test"]
    column = data_args.label_column_name
    first = next(iter(data.values()))
    for needed, flag in ((data_args.image_column_name, "--image_column_name"), (column, "--label_column_name")):
        if needed not in first.column_names:
            fix = ("put the images in one sub-folder per class (the sub-folder names are the labels)"
                   if data_args.train_dir and flag == "--label_column_name" else f"name the column with {flag}")
            raise ValueError(f"{source} has no column {needed!r} (it has {first.column_names}); {fix}.")
    feature = first.features[column]
    if not isinstance(feature, datasets.ClassLabel):
        raise ValueError(f"Column {column!r} of {source} is {feature}, not a class label; single-label training "
                         "needs a ClassLabel column: give --label_column_name of one, or use an imagefolder "
                         "(--train_dir), whose sub-folder names are the labels.")
    return data, LabelSpace(list(feature.names), False, column)


def select_splits(data: datasets.DatasetDict, labels: LabelSpace, data_args: DataTrainingArguments,
                  training_args, show_progress: bool = False) -> dict[str, datasets.Dataset]:
    """The splits the run reads (truncated as asked), checked before training: rows, images and labels.

    An empty split or a label outside the label set is an error; bad images are an error naming each
    file, or are dropped with ``--skip_bad_images``. A test split labelled only -1 (unlabelled, as
    many Hub data sets' are) is predicted without scores. The image column stays undecoded
    (``{"bytes", "path"}``; `ImageTransform` decodes), so a file that fails later names itself.
    """
    source = data_source(data_args)
    wanted = {"train": (training_args.do_train, data_args.max_train_samples),
              "validation": (training_args.do_eval, data_args.max_eval_samples),
              "test": (training_args.do_predict and "test" in data, None)}  # fmt: skip
    if training_args.do_predict and "test" not in data:
        logger.warning("--do_predict has no effect: %s has no test split (it has %s).", source, list(data))
    splits = {}
    for name, (used, limit) in wanted.items():
        if not used:
            continue
        if name not in data:
            raise ValueError(f"{source} has no {name} split (it has {list(data)}); drop --do_"
                             f"{'train' if name == 'train' else 'eval'} or use a data set with one.")
        split = _truncate(data[name], limit)
        fix = ("add images, or lower --train_val_split" if data_args.chestxray_dir
               else "give a data set or folder with images in it.")
        require_rows(split, name, source, fix)
        if data_args.chestxray_dir:  # every image was checked when the folder was prepared
            split = undecoded(split, data_args.image_column_name, source)
        else:
            split = keep_good_images(split, data_args.image_column_name, name, source, data_args.skip_bad_images,
                                     show_progress)
            require_rows(split, name, source, "every one of its images was skipped as bad (--skip_bad_images, the warning above "
                         "lists them): replace or convert them.")
        if not labels.multi_label:
            if name == "test" and all(label == -1 for label in split[labels.label_column]):
                logger.warning("The test split of %s has no labels (all -1): predicting without scores.", source)
                split = split.remove_columns(labels.label_column)
            else:
                check_class_labels(split, labels.label_column, labels.names, name, source)
        splits[name] = split
    return splits
