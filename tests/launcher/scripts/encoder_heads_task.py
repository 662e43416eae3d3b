"""An encoder script in the style of 0.7's run_mlm.py, run_glue.py and run_qa.py, for the launcher's tests.

`--task mlm`: sentences tokenized line by line to a fixed length, `AutoModelForMaskedLM`, and
`DataCollatorForLanguageModeling` masking `--mlm_probability` of the tokens (15 %) (seeded, so two runs mask alike).
`--task classification`: sentence pairs padded to a fixed length, `AutoModelForSequenceClassification`,
`default_data_collator`. `--task qa`: the pairs read as question and context, with answer start and end
token positions as labels, `AutoModelForQuestionAnswering`. Each loads with `AutoConfig` /
`AutoTokenizer` / `from_pretrained`, builds `IPUConfig.from_pretrained(ipu_config_name)` and
`IPUTrainer`, trains if asked, then evaluates and predicts. With --plain_trainer, transformers' own
`Trainer` runs instead (the reference). Writes the metrics and the predictions to
OUTPUT_DIR/results.json.
"""

import json
import os
from dataclasses import dataclass, field

import numpy as np
import transformers
from datasets import load_dataset
from transformers import (
    AutoConfig,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    default_data_collator,
    set_seed,
)

from optimum.graphcore import IPUConfig, IPUTrainer, IPUTrainingArguments

MODELS = {
    "mlm": AutoModelForMaskedLM,
    "classification": AutoModelForSequenceClassification,
    "qa": AutoModelForQuestionAnswering,
}


@dataclass
class TaskArguments:
    task: str = field(default="mlm", metadata={"help": "mlm, classification or qa."})
    model_name_or_path: str = field(default=None, metadata={"help": "Local model and tokenizer folder."})
    train_file: str = field(default=None, metadata={"help": "CSV with sentence1, sentence2, label."})
    validation_file: str = field(default=None, metadata={"help": "CSV with sentence1, sentence2, label."})
    max_seq_length: int = field(default=16, metadata={"help": "Tokens per sample (padded)."})
    mlm_probability: float = field(
        default=0.15, metadata={"help": "Share of tokens masked (run_mlm.py's flag)."}
    )
    plain_trainer: bool = field(
        default=False, metadata={"help": "transformers' Trainer instead of IPUTrainer."}
    )


def main():
    task_args, training_args = HfArgumentParser(
        (TaskArguments, IPUTrainingArguments)
    ).parse_args_into_dataclasses()
    set_seed(training_args.seed)
    files = {"train": task_args.train_file, "validation": task_args.validation_file}
    raw = load_dataset("csv", data_files={k: v for k, v in files.items() if v})
    config = AutoConfig.from_pretrained(task_args.model_name_or_path, num_labels=2)
    tokenizer = AutoTokenizer.from_pretrained(task_args.model_name_or_path)
    model = MODELS[task_args.task].from_pretrained(task_args.model_name_or_path, config=config)
    length = task_args.max_seq_length

    def tokenize(batch):
        if task_args.task == "mlm":
            return tokenizer(batch["sentence1"], padding="max_length", truncation=True, max_length=length,
                             return_special_tokens_mask=True)  # fmt: skip
        features = tokenizer(batch["sentence2"], batch["sentence1"], padding="max_length", truncation=True,
                             max_length=length)  # fmt: skip
        if task_args.task == "qa":  # the answer: a span of the context (after [CLS] question [SEP])
            starts = [len(tokenizer(q)["input_ids"]) + (i % 3) for i, q in enumerate(batch["sentence2"])]
            features["start_positions"] = starts
            features["end_positions"] = [s + label for s, label in zip(starts, batch["label"])]
        else:
            features["labels"] = batch["label"]
        return features

    columns = raw["validation"].column_names
    data = raw.map(tokenize, batched=True, remove_columns=columns)
    if task_args.task == "mlm":
        collator = DataCollatorForLanguageModeling(
            tokenizer, mlm_probability=task_args.mlm_probability, seed=training_args.seed
        )
    else:
        collator = default_data_collator
    common = dict(
        model=model,
        args=training_args,
        data_collator=collator,
        train_dataset=data["train"] if training_args.do_train else None,
        eval_dataset=data["validation"],
    )
    if task_args.plain_trainer:
        trainer = transformers.Trainer(**common)
    else:
        ipu_config = IPUConfig.from_pretrained(training_args.ipu_config_name)
        trainer = IPUTrainer(ipu_config=ipu_config, **common)
    results = {}
    if training_args.do_train:
        results["train"] = trainer.train().metrics
    results["eval"] = trainer.evaluate()
    if task_args.task != "mlm":  # masking draws again: only the unmasked heads predict alike twice
        predictions = trainer.predict(data["validation"]).predictions
        parts = predictions if isinstance(predictions, tuple) else (predictions,)
        results["predictions"] = [np.asarray(p).tolist() for p in parts]
    with open(os.path.join(training_args.output_dir, "results.json"), "w") as file:
        json.dump(results, file)


if __name__ == "__main__":
    main()
