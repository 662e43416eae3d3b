"""A summarization script in the style of 0.7's run_summarization.py, for the launcher's tests.

Uses what that script uses: `from transformers.utils import is_offline_mode`, `HfArgumentParser` with
`IPUSeq2SeqTrainingArguments` (`--predict_with_generate`, `--generation_max_length`, `--static_generation`),
`load_dataset("json", data_files=..., use_auth_token=None)`, `AutoConfig` / `AutoTokenizer` /
`AutoModelForSeq2SeqLM.from_pretrained(..., use_auth_token=None)`, `IPUConfig.from_pretrained`, sources and
`text_target=` summaries tokenized in `map(batched=True)`, `DataCollatorForSeq2Seq` (labels padded with -100),
`evaluate.load("rouge")` on decoded generations (sentences one per line for rougeLsum), generation length and
beams set on the training arguments, `IPUSeq2SeqTrainer(..., tokenizer=...)`, then train, evaluate and predict.
With --plain_trainer, transformers' own `Seq2SeqTrainer` runs instead (the reference). Writes the metrics and
the decoded test predictions to OUTPUT_DIR/results.json.
"""

import json
import os
from dataclasses import dataclass, field

import evaluate
import numpy as np
import transformers
from datasets import load_dataset
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    set_seed,
)
from transformers.utils import is_offline_mode, send_example_telemetry

from optimum.graphcore import IPUConfig, IPUSeq2SeqTrainer
from optimum.graphcore import IPUSeq2SeqTrainingArguments as Seq2SeqTrainingArguments


@dataclass
class TaskArguments:
    model_name_or_path: str = field(default=None, metadata={"help": "Local model and tokenizer folder."})
    data_dir: str = field(
        default=None, metadata={"help": "Folder of summarization_{train,validation,test}.json."}
    )
    max_source_length: int = field(
        default=16, metadata={"help": "Sources are truncated to this many tokens."}
    )
    max_target_length: int = field(default=8, metadata={"help": "Summaries too; the generation length."})
    num_beams: int = field(default=None, metadata={"help": "Beams for generation (as the example's flag)."})
    use_auth_token: bool = field(default=False, metadata={"help": "As in the examples."})
    plain_trainer: bool = field(default=False, metadata={"help": "transformers' Seq2SeqTrainer instead."})


def sentences_per_line(text: str) -> str:
    """rougeLsum compares summaries sentence by sentence, one per line (the example splits with nltk)."""
    return "\n".join(part.strip() + " ." for part in text.strip().split(" .") if part.strip())


def main():
    task_args, training_args = HfArgumentParser(
        (TaskArguments, Seq2SeqTrainingArguments)
    ).parse_args_into_dataclasses()
    send_example_telemetry("summarization_task", task_args)
    if is_offline_mode():
        print("offline: everything is read from local folders")
    set_seed(training_args.seed)
    token = True if task_args.use_auth_token else None
    files = {split: os.path.join(task_args.data_dir, f"summarization_{split}.json") for split in ("train", "validation", "test")}  # fmt: skip
    raw = load_dataset("json", data_files=files, use_auth_token=token)
    config = AutoConfig.from_pretrained(task_args.model_name_or_path, use_auth_token=token)
    tokenizer = AutoTokenizer.from_pretrained(task_args.model_name_or_path, use_auth_token=token)
    model = AutoModelForSeq2SeqLM.from_pretrained(
        task_args.model_name_or_path, config=config, use_auth_token=token
    )

    def preprocess(batch):
        inputs = tokenizer(batch["text"], max_length=task_args.max_source_length, truncation=True)
        labels = tokenizer(
            text_target=batch["summary"], max_length=task_args.max_target_length, truncation=True
        )
        inputs["labels"] = labels["input_ids"]
        return inputs

    splits = {name: split.map(preprocess, batched=True, remove_columns=split.column_names) for name, split in raw.items()}  # fmt: skip
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    rouge = evaluate.load("rouge")

    def decode(tokens):
        return tokenizer.batch_decode(
            np.where(tokens != -100, tokens, tokenizer.pad_token_id), skip_special_tokens=True
        )

    def compute_metrics(prediction):
        predictions, labels = prediction
        decoded = [sentences_per_line(text) for text in decode(predictions)]
        references = [sentences_per_line(text) for text in decode(labels)]
        result = rouge.compute(predictions=decoded, references=references, use_stemmer=True)
        result = {key: round(value * 100, 4) for key, value in result.items()}
        result["gen_len"] = float(
            np.mean([np.count_nonzero(p != tokenizer.pad_token_id) for p in predictions])
        )
        return result

    training_args.generation_max_length = training_args.generation_max_length or task_args.max_target_length
    training_args.generation_num_beams = task_args.num_beams or training_args.generation_num_beams
    common = dict(model=model, args=training_args, train_dataset=splits["train"], eval_dataset=splits["validation"],
                  data_collator=collator, compute_metrics=compute_metrics)  # fmt: skip
    if task_args.plain_trainer:
        trainer = transformers.Seq2SeqTrainer(processing_class=tokenizer, **common)
    else:
        ipu_config = IPUConfig.from_pretrained(training_args.ipu_config_name, use_auth_token=token)
        trainer = IPUSeq2SeqTrainer(ipu_config=ipu_config, tokenizer=tokenizer, **common)
    train_metrics = trainer.train().metrics
    eval_metrics = trainer.evaluate(metric_key_prefix="eval")
    predicted = trainer.predict(splits["test"], metric_key_prefix="predict")
    os.makedirs(training_args.output_dir, exist_ok=True)
    with open(os.path.join(training_args.output_dir, "results.json"), "w") as file:
        json.dump({"train": train_metrics, "eval": eval_metrics, "predict": predicted.metrics,
                   "predictions": decode(predicted.predictions)}, file)  # fmt: skip


if __name__ == "__main__":
    main()
