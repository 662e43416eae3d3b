"""A translation script in the style of 0.7's run_translation.py, for the launcher's tests.

Uses what that script uses: `HfArgumentParser` with `IPUSeq2SeqTrainingArguments`, JSON lines with a
"translation" column of {language: text} read by `load_dataset("json", data_files=..., use_auth_token=None)`,
`--source_lang` / `--target_lang` / `--source_prefix`, `AutoTokenizer` / `AutoModelForSeq2SeqLM.from_pretrained(...,
use_auth_token=None)`, `text_target=` tokenization, `DataCollatorForSeq2Seq(padding="max_length")` (static input
shapes, the tokenizer's maximum length), `evaluate.load("sacrebleu")` with one reference per prediction, and
generation settings handed to `evaluate(max_length=..., num_beams=...)` and `predict(...)` as keywords, with
`IPUSeq2SeqTrainer(..., tokenizer=...)`. With --plain_trainer, transformers' own `Seq2SeqTrainer` runs instead
(the reference). Writes the metrics and the decoded test predictions to OUTPUT_DIR/results.json.
"""

import json
import os
from dataclasses import dataclass, field

import evaluate
import numpy as np
import transformers
from datasets import load_dataset
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    set_seed,
)
from transformers.utils import send_example_telemetry

from optimum.graphcore import IPUConfig, IPUSeq2SeqTrainer
from optimum.graphcore import IPUSeq2SeqTrainingArguments as Seq2SeqTrainingArguments


@dataclass
class TaskArguments:
    model_name_or_path: str = field(default=None, metadata={"help": "Local model and tokenizer folder."})
    data_dir: str = field(
        default=None, metadata={"help": "Folder of translation_{train,validation,test}.json."}
    )
    source_lang: str = field(default="en", metadata={"help": "Source language key."})
    target_lang: str = field(default="xx", metadata={"help": "Target language key."})
    source_prefix: str = field(default="", metadata={"help": "Put before every source (T5's task prefix)."})
    max_target_length: int = field(default=8, metadata={"help": "Targets are truncated to this many tokens."})
    num_beams: int = field(default=None, metadata={"help": "Beams for generation (as the example's flag)."})
    use_auth_token: bool = field(default=False, metadata={"help": "As in the examples."})
    plain_trainer: bool = field(default=False, metadata={"help": "transformers' Seq2SeqTrainer instead."})


def main():
    task_args, training_args = HfArgumentParser(
        (TaskArguments, Seq2SeqTrainingArguments)
    ).parse_args_into_dataclasses()
    send_example_telemetry("translation_task", task_args)
    set_seed(training_args.seed)
    token = True if task_args.use_auth_token else None
    files = {split: os.path.join(task_args.data_dir, f"translation_{split}.json") for split in ("train", "validation", "test")}  # fmt: skip
    raw = load_dataset("json", data_files=files, use_auth_token=token)
    tokenizer = AutoTokenizer.from_pretrained(task_args.model_name_or_path, use_auth_token=token)
    model = AutoModelForSeq2SeqLM.from_pretrained(task_args.model_name_or_path, use_auth_token=token)
    source, target = task_args.source_lang, task_args.target_lang

    def preprocess(batch):
        sources = [task_args.source_prefix + pair[source] for pair in batch["translation"]]
        inputs = tokenizer(sources, truncation=True)
        targets = [pair[target] for pair in batch["translation"]]
        inputs["labels"] = tokenizer(text_target=targets, max_length=task_args.max_target_length, truncation=True)["input_ids"]  # fmt: skip
        return inputs

    splits = {name: split.map(preprocess, batched=True, remove_columns=split.column_names) for name, split in raw.items()}  # fmt: skip
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, padding="max_length", label_pad_token_id=-100)
    bleu = evaluate.load("sacrebleu")

    def decode(tokens):
        return tokenizer.batch_decode(
            np.where(tokens != -100, tokens, tokenizer.pad_token_id), skip_special_tokens=True
        )

    def compute_metrics(prediction):
        predictions, labels = prediction
        decoded = [text.strip() for text in decode(predictions)]
        references = [[text.strip()] for text in decode(labels)]
        result = {"bleu": bleu.compute(predictions=decoded, references=references)["score"]}
        result["gen_len"] = float(
            np.mean([np.count_nonzero(p != tokenizer.pad_token_id) for p in predictions])
        )
        return {key: round(value, 4) for key, value in result.items()}

    common = dict(model=model, args=training_args, train_dataset=splits["train"], eval_dataset=splits["validation"],
                  data_collator=collator, compute_metrics=compute_metrics)  # fmt: skip
    if task_args.plain_trainer:
        trainer = transformers.Seq2SeqTrainer(processing_class=tokenizer, **common)
    else:
        ipu_config = IPUConfig.from_pretrained(training_args.ipu_config_name, use_auth_token=token)
        trainer = IPUSeq2SeqTrainer(ipu_config=ipu_config, tokenizer=tokenizer, **common)
    train_metrics = trainer.train().metrics
    generation = dict(max_length=training_args.generation_max_length or task_args.max_target_length,
                      num_beams=task_args.num_beams or training_args.generation_num_beams)  # fmt: skip
    eval_metrics = trainer.evaluate(metric_key_prefix="eval", **generation)
    predicted = trainer.predict(splits["test"], metric_key_prefix="predict", **generation)
    os.makedirs(training_args.output_dir, exist_ok=True)
    with open(os.path.join(training_args.output_dir, "results.json"), "w") as file:
        json.dump({"train": train_metrics, "eval": eval_metrics, "predict": predicted.metrics,
                   "predictions": decode(predicted.predictions)}, file)  # fmt: skip


if __name__ == "__main__":
    main()
