#!/usr/bin/env python
"""Fine-tune a model for extractive question answering (SQuAD v1.1 / v2.0) on a simulated IPU.

The command line of Optimum Graphcore's run_qa.py works unchanged, e.g. (seed 001)::

    python run_qa.py --model_name_or_path bert-base-uncased --ipu_config_name Graphcore/bert-base-ipu \\
        --dataset_name squad --do_train --do_eval --per_device_train_batch_size 2 \\
        --gradient_accumulation_steps 16 --pod_type pod16 --loss_scaling 64 --warmup_ratio 0.2 \\
        --ipu_config_overrides "embedding_serialization_factor=2" --output_dir squad_out

Data comes from the Hub (``--dataset_name squad``) or from local files (``--train_file`` /
``--validation_file`` / ``--test_file``) in SQuAD's nested JSON layout or the Hub's flattened one
(see qa_data.py). The IPU config is ``--ipu_config_name`` or the model's own ``ipu_config.json``,
adjusted by ``--pod_type`` / ``--n_ipu``, ``--gradient_accumulation_steps`` and
``--ipu_config_overrides``. Results: ``eval_exact_match`` / ``eval_f1`` (0-100) in
``all_results.json``, answers in ``eval_predictions.json`` and ``eval_nbest_predictions.json``.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from functools import partial

import datasets
import transformers
from qa_data import TEXT_COLUMNS, describe_problems, find_empty_text, load_qa_files
from qa_features import FeatureSettings, check_tokenizer, prepare_train_features, prepare_validation_features
from squad_metric import compute as compute_squad_metric
from trainer_qa import QuestionAnsweringIPUTrainer
from transformers import (
    AutoConfig,
    AutoModelForQuestionAnswering,
    AutoTokenizer,
    DataCollatorWithPadding,
    EvalPrediction,
    HfArgumentParser,
    default_data_collator,
    set_seed,
)
from utils_qa import postprocess_qa_predictions

from optimum_ipu import IPUTrainingArguments, get_last_checkpoint
from optimum_ipu.training_args import resolve_ipu_config

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("id", "question", "context", "answers")


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to fine-tune."""

    model_name_or_path: str = field(metadata={"help": "Model folder or Hub id (e.g. bert-base-uncased)."})
    config_name: str | None = field(default=None, metadata={"help": "Config name or path, if not the model's."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer name or path, if not the model's."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where Hub downloads are cached."})
    model_revision: str = field(default="main", metadata={"help": "Hub revision: branch, tag or commit."})


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how examples become features and answers."""

    dataset_name: str | None = field(default=None, metadata={"help": "Hub data set, e.g. squad or squad_v2."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of the Hub data set."})
    train_file: str | None = field(default=None, metadata={"help": "Training file: SQuAD JSON or flat JSON(L)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation file, same layouts."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction file, same layouts."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute cached features."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})
    max_seq_length: int = field(default=384, metadata={"help": "Tokens per feature (question + context window)."})
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "Pad every feature to max_seq_length (static shapes, as IPUs need)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Truncate training examples/features."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Truncate evaluation examples/features."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Truncate prediction examples."})
    version_2_with_negative: bool = field(default=False, metadata={"help": "Some questions have no answer (v2)."})
    null_score_diff_threshold: float = field(
        default=0.0, metadata={"help": "v2: answer 'no answer' when null score - best span score exceeds this."}
    )
    doc_stride: int = field(default=128, metadata={"help": "Overlap, in tokens, between windows of a long context."})
    n_best_size: int = field(default=20, metadata={"help": "Candidate start/end positions and answers kept."})
    max_answer_length: int = field(default=30, metadata={"help": "Longest answer, in tokens."})
    evaluate_before_training: bool = field(
        default=False,
        metadata={"help": "With --do_train --do_eval, also evaluate the model as loaded, before training: its "
                  "scores are logged and saved with the prefix untrained_ (what training bought)."},
    )

    def __post_init__(self):
        if not (self.dataset_name or self.train_file or self.validation_file or self.test_file):
            raise ValueError("Give a data set: --dataset_name (e.g. squad) or --train_file/--validation_file/--test_file.")
        for flag in ("train_file", "validation_file", "test_file"):
            path = getattr(self, flag)
            if path and not os.path.isfile(path):
                raise FileNotFoundError(f"--{flag} {path}: no such file. Give the path of a SQuAD-format JSON "
                                        "file (or generate one with make_synthetic_squad.py).")
        for flag, low in (("max_seq_length", 1), ("doc_stride", 0), ("n_best_size", 1), ("max_answer_length", 1),
                          ("max_train_samples", 1), ("max_eval_samples", 1), ("max_predict_samples", 1),
                          ("preprocessing_num_workers", 1)):  # fmt: skip
            value = getattr(self, flag)
            if value is not None and value < low:
                raise ValueError(f"--{flag} must be >= {low}, got {value}.")


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


def split_source(data_args: DataTrainingArguments, split: str) -> str:
    """Where a split comes from, as the user gave it: ``--train_file PATH`` or ``--dataset_name NAME``."""
    if data_args.dataset_name:
        return f"the {split} split of --dataset_name {data_args.dataset_name}"
    flag = {"train": "train_file", "validation": "validation_file", "test": "test_file"}[split]
    return f"--{flag} {getattr(data_args, flag)}"


def _hub_data_set(data_args: DataTrainingArguments, cache_dir: str | None) -> datasets.DatasetDict:
    try:
        return datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name, cache_dir=cache_dir)
    except (ConnectionError, FileNotFoundError) as error:  # offline, or no such data set
        raise OSError(f"Cannot load --dataset_name {data_args.dataset_name!r} ({error}). Give a Hub data set id "
                      "(e.g. squad) or a local folder of data files; offline (HF_DATASETS_OFFLINE=1), a Hub data set "
                      "must already be in the Hugging Face cache, or use --train_file/--validation_file.") from error


def _drop_empty_text(dataset: datasets.Dataset, source: str) -> datasets.Dataset:
    """A Hub data set cannot be edited: its records with an empty question or context are dropped, with a warning."""
    empty = find_empty_text(dataset["id"], {column: dataset[column] for column in TEXT_COLUMNS})
    if not empty:
        return dataset
    logger.warning("Dropping %d of %d records of %s with an empty question or context:%s", len(empty), len(dataset),
                   source, describe_problems([d for _, d in empty]))
    dropped = {row for row, _ in empty}
    return dataset.select([row for row in range(len(dataset)) if row not in dropped])


def load_raw_datasets(data_args: DataTrainingArguments, model_args: ModelArguments) -> datasets.DatasetDict:
    """The raw examples by split, from the Hub or local files, with the squad columns checked.

    Local files are checked record by record (`qa_data`); a Hub data set's records with an empty
    question or context are dropped with a warning.
    """
    if data_args.dataset_name:
        raw = _hub_data_set(data_args, model_args.cache_dir)
    else:
        raw = load_qa_files({"train": data_args.train_file, "validation": data_args.validation_file,
                             "test": data_args.test_file})
    for split, dataset in raw.items():
        missing = [c for c in REQUIRED_COLUMNS if c not in dataset.column_names]
        if missing:
            raise ValueError(f"{split_source(data_args, split)} lacks the column(s) {missing} (it has "
                             f"{dataset.column_names}); rename its columns to SQuAD's id/question/context/answers.")
        if data_args.dataset_name:
            raw[split] = _drop_empty_text(dataset, split_source(data_args, split))
    return raw


def require_split(raw: datasets.DatasetDict, split: str, data_args: DataTrainingArguments) -> datasets.Dataset:
    """The split a ``--do_*`` flag needs; a missing or empty one is an error naming the flag and the source."""
    flag = {"train": "--do_train", "validation": "--do_eval", "test": "--do_predict"}[split]
    file_flag = {"train": "--train_file", "validation": "--validation_file", "test": "--test_file"}[split]
    if split not in raw:
        raise ValueError(f"{flag} needs a {split} split: give {file_flag}, or a --dataset_name with a {split} split"
                         f"{f' ({data_args.dataset_name} has {list(raw)})' if data_args.dataset_name else ''}.")
    if len(raw[split]) == 0:
        raise ValueError(f"{split_source(data_args, split)} is empty (0 questions); {flag} needs questions: give "
                         f"another {file_flag} or data set, or drop {flag}.")
    return raw[split]


def check_answerable(train: datasets.Dataset, version_2_with_negative: bool, source: str = "the train split") -> None:
    """SQuAD v1 training data must answer every question; unanswerable ones need v2 mode."""
    if version_2_with_negative:
        return
    unanswered = [qid for qid, answers in zip(train["id"], train["answers"]) if not answers["text"]]
    if unanswered:
        raise ValueError(f"{source}: {len(unanswered)} of {len(train)} training question(s) have no answer "
                         f"(answers text [], e.g. id {', '.join(map(repr, unanswered[:5]))}). For SQuAD v2-style "
                         "data pass --version_2_with_negative; otherwise give every question its answer.")


def _select(dataset: datasets.Dataset, limit: int | None) -> datasets.Dataset:
    return dataset.select(range(min(limit, len(dataset)))) if limit is not None else dataset


def build_features(raw, split: str, tokenizer, data_args: DataTrainingArguments, training_args, limit: int | None):
    """Tokenise one split into features; returns ``(examples, features)``.

    ``limit`` applies to examples first (cheap) and, for training, to features too, because one
    example can give several features.
    """
    examples = _select(raw[split], limit)
    settings = FeatureSettings(min(data_args.max_seq_length, tokenizer.model_max_length), data_args.doc_stride,
                               data_args.pad_to_max_length)
    prepare = prepare_train_features if split == "train" else prepare_validation_features
    with training_args.main_process_first(desc=f"{split} tokenisation"):
        features = examples.map(
            partial(prepare, tokenizer=tokenizer, settings=settings),
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            remove_columns=examples.column_names,
            load_from_cache_file=not data_args.overwrite_cache,
            desc=f"Tokenising the {split} split",
        )
    if split == "train":
        features = _select(features, limit)
    return examples, features


def make_post_processing(data_args: DataTrainingArguments, training_args):
    """The ``(examples, features, logits, stage) -> EvalPrediction`` function the QA trainer calls."""

    def post_process(examples, features, predictions, stage: str = "eval") -> EvalPrediction:
        result = postprocess_qa_predictions(
            examples, features, predictions,
            version_2_with_negative=data_args.version_2_with_negative,
            n_best_size=data_args.n_best_size,
            max_answer_length=data_args.max_answer_length,
            null_score_diff_threshold=data_args.null_score_diff_threshold,
            output_dir=training_args.output_dir if training_args.should_save else None,
            prefix=stage,
        )
        formatted = [{"id": qid, "prediction_text": text} for qid, text in result.predictions.items()]
        if data_args.version_2_with_negative:
            for row in formatted:
                row["no_answer_probability"] = result.no_answer_probability[row["id"]]
        has_answers = "answers" in examples.column_names and any(a["text"] for a in examples["answers"])
        references = [{"id": ex_id, "answers": answers} for ex_id, answers in zip(examples["id"], examples["answers"])]
        return EvalPrediction(predictions=formatted, label_ids=references if has_answers else None)

    return post_process


def make_compute_metrics(version_2_with_negative: bool):
    """``compute_metrics`` for the trainer: SQuAD scores of post-processed answers."""

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        return compute_squad_metric(prediction.predictions, prediction.label_ids, version_2_with_negative)

    return compute_metrics


def setup_logging(training_args) -> None:
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    level = training_args.get_process_log_level()
    logger.setLevel(level)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()


def detect_checkpoint(training_args) -> str | None:
    """The last checkpoint to resume from: ``--resume_from_checkpoint``, or one found in output_dir."""
    if training_args.resume_from_checkpoint:
        return training_args.resume_from_checkpoint
    output_dir = training_args.output_dir
    if not (training_args.do_train and os.path.isdir(output_dir)) or getattr(training_args, "overwrite_output_dir", False):
        return None
    last = get_last_checkpoint(output_dir, save_only_model=training_args.save_only_model)  # complete ones only
    if last is not None:
        logger.info("Resuming from %s; pass --overwrite_output_dir to start afresh.", last)
    return last


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run training / evaluation / prediction as the arguments ask; return all metrics."""
    model_args, data_args, training_args = parse_arguments(argv)
    setup_logging(training_args)
    logger.info("Training/evaluation parameters %s", training_args)
    last_checkpoint = detect_checkpoint(training_args)
    set_seed(training_args.seed)

    raw = load_raw_datasets(data_args, model_args)
    for split, wanted in (("train", training_args.do_train), ("validation", training_args.do_eval),
                          ("test", training_args.do_predict)):  # fmt: skip
        if wanted:  # every split the run reads, checked before the model loads
            require_split(raw, split, data_args)
    if training_args.do_train:
        check_answerable(raw["train"], data_args.version_2_with_negative, split_source(data_args, "train"))
    hub = dict(cache_dir=model_args.cache_dir, revision=model_args.model_revision)
    config = from_pretrained(AutoConfig, model_args.config_name or model_args.model_name_or_path, "config", **hub)
    tokenizer = from_pretrained(AutoTokenizer, model_args.tokenizer_name or model_args.model_name_or_path,
                                "tokenizer", **hub)
    model = from_pretrained(AutoModelForQuestionAnswering, model_args.model_name_or_path, "model", config=config,
                            **hub)
    ipu_config = resolve_ipu_config(training_args, model_args.model_name_or_path)
    check_tokenizer(tokenizer, FeatureSettings(min(data_args.max_seq_length, tokenizer.model_max_length),
                                               data_args.doc_stride, data_args.pad_to_max_length))

    train_features = eval_examples = eval_features = None
    if training_args.do_train:
        _, train_features = build_features(raw, "train", tokenizer, data_args, training_args,
                                           data_args.max_train_samples)
    if training_args.do_eval:
        eval_examples, eval_features = build_features(raw, "validation", tokenizer, data_args, training_args,
                                                      data_args.max_eval_samples)

    collator = default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer)
    trainer = QuestionAnsweringIPUTrainer(
        model, ipu_config, args=training_args, train_dataset=train_features, eval_dataset=eval_features,
        eval_examples=eval_examples, processing_class=tokenizer, data_collator=collator,
        post_process_function=make_post_processing(data_args, training_args),
        compute_metrics=make_compute_metrics(data_args.version_2_with_negative),
    )

    all_metrics: dict[str, float] = {}
    if training_args.do_train and training_args.do_eval and data_args.evaluate_before_training:
        metrics = dict(trainer.evaluate(metric_key_prefix="untrained"))
        trainer.log_metrics("untrained", metrics)
        trainer.save_metrics("untrained", metrics)
        all_metrics.update(metrics)
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=last_checkpoint)
        trainer.save_model()
        metrics = dict(result.metrics, train_samples=len(train_features), train_steps=result.global_step)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        all_metrics.update(metrics)
    if training_args.do_eval:
        metrics = dict(trainer.evaluate(), eval_samples=len(eval_examples))
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        all_metrics.update(metrics)
    if training_args.do_predict:
        predict_examples, predict_features = build_features(raw, "test", tokenizer, data_args, training_args,
                                                            data_args.max_predict_samples)
        output = trainer.predict(predict_features, predict_examples, metric_key_prefix="predict")
        metrics = dict(output.metrics, predict_samples=len(predict_examples))
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
        all_metrics.update(metrics)
    return all_metrics


if __name__ == "__main__":
    main()
