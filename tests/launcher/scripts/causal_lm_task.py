"""A causal language-modelling script in the style of 0.7's run_clm.py, for the launcher's tests.

Uses what that script uses: `HfArgumentParser` with `IPUTrainingArguments`, `load_dataset("text",
data_files=...)`, `AutoConfig` / `AutoTokenizer` / `AutoModelForCausalLM.from_pretrained`,
`IPUConfig.from_pretrained(ipu_config_name)`, the text tokenized in `map(batched=True)` and concatenated
into blocks of `block_size` tokens with `labels` a copy of `input_ids` (the model shifts them),
`default_data_collator`, `IPUTrainer`, then train and / or evaluate with `perplexity = exp(eval_loss)`.
Writes the metrics to OUTPUT_DIR/results.json.
"""

import json
import math
import os
from dataclasses import dataclass, field
from itertools import chain

from datasets import load_dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    HfArgumentParser,
    default_data_collator,
    set_seed,
)

from optimum.graphcore import IPUConfig, IPUTrainer, IPUTrainingArguments


@dataclass
class TaskArguments:
    model_name_or_path: str = field(default=None, metadata={"help": "Local model and tokenizer folder."})
    train_file: str = field(default=None, metadata={"help": "A text file."})
    validation_file: str = field(default=None, metadata={"help": "A text file."})
    block_size: int = field(default=32, metadata={"help": "Tokens per block."})


def main():
    task_args, training_args = HfArgumentParser(
        (TaskArguments, IPUTrainingArguments)
    ).parse_args_into_dataclasses()
    set_seed(training_args.seed)
    files = {
        k: v for k, v in (("train", task_args.train_file), ("validation", task_args.validation_file)) if v
    }
    raw = load_dataset("text", data_files=files)
    tokenizer = AutoTokenizer.from_pretrained(task_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(task_args.model_name_or_path)
    ipu_config = IPUConfig.from_pretrained(training_args.ipu_config_name or task_args.model_name_or_path)

    tokenized = raw.map(lambda batch: tokenizer(batch["text"]), batched=True, remove_columns=["text"])
    block = task_args.block_size

    def group_texts(examples):
        joined = {k: list(chain(*examples[k])) for k in examples}
        total = (len(joined["input_ids"]) // block) * block
        result = {k: [t[i : i + block] for i in range(0, total, block)] for k, t in joined.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    blocks = tokenized.map(group_texts, batched=True)
    trainer = IPUTrainer(
        model=model, ipu_config=ipu_config, args=training_args,
        train_dataset=blocks["train"] if training_args.do_train else None,
        eval_dataset=blocks["validation"] if training_args.do_eval else None,
        tokenizer=tokenizer, data_collator=default_data_collator,
    )  # fmt: skip
    results = {}
    if training_args.do_train:
        results["train"] = trainer.train().metrics
        trainer.save_model()
    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["perplexity"] = math.exp(metrics["eval_loss"])
        metrics["eval_blocks"] = len(blocks["validation"])
        results["eval"] = metrics
    with open(os.path.join(training_args.output_dir, "results.json"), "w") as file:
        json.dump(results, file)


if __name__ == "__main__":
    main()
