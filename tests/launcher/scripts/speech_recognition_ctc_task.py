"""A CTC speech-recognition script in the style of 0.7's run_speech_recognition_ctc.py, for the launcher's tests.

Uses what that script uses: an `audiofolder` with transcripts loaded by `load_dataset(..., use_auth_token=None)`,
punctuation stripped with `map`, a character vocabulary built from the data (`map(batched=True,
batch_size=-1)`) and written to OUTPUT_DIR/vocab.json, `AutoTokenizer.from_pretrained(OUTPUT_DIR,
config=... if config.tokenizer_class is not None ..., tokenizer_type=...)`, `config.update(...)`,
`AutoModelForCTC`, `audio["array"]` through the feature extractor, a length filter, `evaluate.load`
of "wer" and "cer", a `Wav2Vec2Processor` padding inputs and labels (-100) in a data collator, and
`trainer.train(resume_from_checkpoint=MODEL_FOLDER)`. With --plain_trainer, transformers' own
`Trainer` runs instead (the reference). Writes metrics, predictions and references to OUTPUT_DIR/results.json.
"""

import json
import os
import re
from dataclasses import dataclass, field

import datasets
import evaluate
import numpy as np
import torch
import transformers
from datasets import DatasetDict, load_dataset
from transformers import (
    AutoConfig,
    AutoFeatureExtractor,
    AutoModelForCTC,
    AutoTokenizer,
    HfArgumentParser,
    Wav2Vec2Processor,
    set_seed,
)
from transformers.utils import send_example_telemetry

from optimum.graphcore import IPUConfig, IPUTrainer
from optimum.graphcore import IPUTrainingArguments as TrainingArguments


@dataclass
class TaskArguments:
    dataset_name: str = field(
        default=None, metadata={"help": "An audiofolder with metadata.csv (file_name, text)."}
    )
    model_name_or_path: str = field(default=None, metadata={"help": "Local model folder (a bare encoder)."})
    max_duration_in_seconds: float = field(default=1.0, metadata={"help": "Longer clips are filtered out."})
    use_auth_token: bool = field(default=False, metadata={"help": "As in the examples."})
    plain_trainer: bool = field(
        default=False, metadata={"help": "transformers' Trainer instead of IPUTrainer."}
    )


@dataclass
class PadForCTC:
    """Pads the audio of a batch to a multiple of `multiple` samples and its labels to a multiple of
    `label_multiple` tokens (padding labels become -100, which the CTC loss ignores)."""

    processor: Wav2Vec2Processor
    multiple: int
    label_multiple: int

    def __call__(self, features):
        batch = self.processor.pad(
            [{"input_values": f["input_values"]} for f in features], padding="longest",
            pad_to_multiple_of=self.multiple, return_tensors="pt",
        )  # fmt: skip
        labels = self.processor.pad(
            labels=[{"input_ids": f["labels"]} for f in features], padding="longest",
            pad_to_multiple_of=self.label_multiple, return_tensors="pt",
        )  # fmt: skip
        batch["labels"] = labels["input_ids"].masked_fill(labels.attention_mask.ne(1), -100)
        if "attention_mask" in batch:
            batch["attention_mask"] = batch["attention_mask"].to(torch.long)
        return batch.data


def character_vocabulary(raw: DatasetDict) -> dict[str, int]:
    """Every character of every split's texts, sorted; the space becomes "|", then [UNK] and [PAD] are added."""
    per_split = raw.map(
        lambda batch: {"characters": [sorted(set(" ".join(batch["target_text"])))]},
        batched=True, batch_size=-1, remove_columns=raw["train"].column_names,
    )  # fmt: skip
    characters = sorted(set().union(*(split["characters"][0] for split in per_split.values())))
    vocabulary = {c: i for i, c in enumerate(characters)}
    vocabulary["|"] = vocabulary.pop(" ")
    vocabulary["[UNK]"] = len(vocabulary)
    vocabulary["[PAD]"] = len(vocabulary)
    return vocabulary


def main():
    task_args, training_args = HfArgumentParser(
        (TaskArguments, TrainingArguments)
    ).parse_args_into_dataclasses()
    send_example_telemetry("speech_recognition_ctc_task", task_args)
    set_seed(training_args.seed)  # before the model is made: a head it initialises is the same in every run
    token = True if task_args.use_auth_token else None
    raw = DatasetDict(
        {
            split: load_dataset(task_args.dataset_name, split=split, use_auth_token=token)
            for split in ("train", "test")
        }
    )
    raw = raw.map(lambda example: {"target_text": re.sub(r"[,.?!]", "", example["text"]).lower() + " "},
                  remove_columns=["text"])  # fmt: skip

    config = AutoConfig.from_pretrained(task_args.model_name_or_path, use_auth_token=token)
    os.makedirs(training_args.output_dir, exist_ok=True)
    with open(os.path.join(training_args.output_dir, "vocab.json"), "w") as file:
        json.dump(character_vocabulary(raw), file)
    tokenizer = AutoTokenizer.from_pretrained(
        training_args.output_dir,
        config=config if config.tokenizer_class is not None else None,
        tokenizer_type=config.model_type if config.tokenizer_class is None else None,
        unk_token="[UNK]", pad_token="[PAD]", word_delimiter_token="|", use_auth_token=token,
    )  # fmt: skip
    extractor = AutoFeatureExtractor.from_pretrained(task_args.model_name_or_path, use_auth_token=token)
    config.update({"pad_token_id": tokenizer.pad_token_id, "vocab_size": len(tokenizer), "layer_norm_eps": 1e-4,
                   "ctc_loss_reduction": "mean", "apply_spec_augment": False, "mask_time_prob": 0.0})  # fmt: skip
    model = AutoModelForCTC.from_pretrained(task_args.model_name_or_path, config=config, use_auth_token=token)
    model.freeze_feature_encoder()

    if raw["train"].features["audio"].sampling_rate != extractor.sampling_rate:
        raw = raw.cast_column("audio", datasets.features.Audio(sampling_rate=extractor.sampling_rate))
    max_length = task_args.max_duration_in_seconds * extractor.sampling_rate

    def prepare(example):
        audio = example["audio"]
        values = extractor(audio["array"], sampling_rate=audio["sampling_rate"]).input_values[0]
        return {
            "input_values": values if training_args.fp32 else values.astype(np.float16),
            "input_length": len(values),
            "labels": tokenizer(example["target_text"]).input_ids,
        }

    processed = raw.map(prepare, remove_columns=raw["train"].column_names)
    processed = processed.filter(lambda length: 0 < length < max_length, input_columns=["input_length"])
    metrics = {name: evaluate.load(name) for name in ("wer", "cer")}
    seen = {}

    def compute_metrics(prediction):
        label_ids = prediction.label_ids
        label_ids[label_ids == -100] = tokenizer.pad_token_id
        seen["predictions"] = tokenizer.batch_decode(np.argmax(prediction.predictions, axis=-1))
        seen["references"] = tokenizer.batch_decode(label_ids, group_tokens=False)
        return {name: m.compute(predictions=seen["predictions"], references=seen["references"])
                for name, m in metrics.items()}  # fmt: skip

    processor = Wav2Vec2Processor(extractor, tokenizer)
    common = dict(
        model=model,
        args=training_args,
        data_collator=PadForCTC(processor, multiple=int(max_length), label_multiple=16),
        train_dataset=processed["train"],
        eval_dataset=processed["test"],
        compute_metrics=compute_metrics,
    )
    if task_args.plain_trainer:
        trainer = transformers.Trainer(**common)
    else:
        ipu_config = IPUConfig.from_pretrained(training_args.ipu_config_name, use_auth_token=token)
        trainer = IPUTrainer(ipu_config=ipu_config, **common)
    train_metrics = trainer.train(resume_from_checkpoint=task_args.model_name_or_path).metrics
    eval_metrics = trainer.evaluate()
    with open(os.path.join(training_args.output_dir, "results.json"), "w") as file:
        json.dump({"train": train_metrics, "eval": eval_metrics, **seen}, file)


if __name__ == "__main__":
    main()
