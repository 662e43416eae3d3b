"""A small script in the style of Optimum Graphcore 0.7's examples, for the launcher's tests.

It uses the APIs those scripts use and transformers v5 / datasets 3 removed: `send_example_telemetry`,
`use_auth_token=`, `load_metric`, `evaluate.load` of a Hub metric; and a sibling module. It evaluates
a tiny BERT with IPUTrainer and writes what it computed to OUTPUT_DIR/results.json.
"""

import json
import os
import sys
from dataclasses import dataclass, field

import evaluate
import numpy as np
from datasets import load_dataset, load_metric
from script_helpers import tokenize_pairs
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, HfArgumentParser
from transformers.utils import send_example_telemetry

from optimum.graphcore import IPUConfig, IPUTrainer
from optimum.graphcore import IPUTrainingArguments as TrainingArguments


@dataclass
class DataArguments:
    train_file: str = field(default=None, metadata={"help": "CSV with sentence1, sentence2, label."})
    validation_file: str = field(default=None, metadata={"help": "CSV with sentence1, sentence2, label."})
    model_name_or_path: str = field(default=None, metadata={"help": "Local model folder."})
    use_auth_token: bool = field(default=False, metadata={"help": "As in the examples."})


def main():
    data_args, training_args = HfArgumentParser(
        (DataArguments, TrainingArguments)
    ).parse_args_into_dataclasses()
    send_example_telemetry("old_text_classification", data_args)
    send_example_telemetry("old_text_classification", data_args)  # twice: the note must appear once
    token = True if data_args.use_auth_token else None
    raw = load_dataset("csv", data_files={"validation": data_args.validation_file}, use_auth_token=token)
    config = AutoConfig.from_pretrained(data_args.model_name_or_path, num_labels=2, use_auth_token=token)
    tokenizer = AutoTokenizer.from_pretrained(data_args.model_name_or_path, use_auth_token=token)
    model = AutoModelForSequenceClassification.from_pretrained(
        data_args.model_name_or_path, config=config, use_auth_token=token
    )
    ipu_config = IPUConfig.from_pretrained(training_args.ipu_config_name, use_auth_token=token)
    validation = raw["validation"].map(lambda batch: tokenize_pairs(tokenizer, batch), batched=True)
    accuracy = evaluate.load("accuracy")
    glue = load_metric("glue", "mrpc")

    def compute_metrics(prediction):
        predicted = np.argmax(prediction.predictions, axis=1)
        return {
            **accuracy.compute(predictions=predicted, references=prediction.label_ids),
            **{
                f"mrpc_{k}": v
                for k, v in glue.compute(predictions=predicted, references=prediction.label_ids).items()
            },
        }

    trainer = IPUTrainer(
        model=model,
        ipu_config=ipu_config,
        args=training_args,
        eval_dataset=validation,
        tokenizer=tokenizer,
        compute_metrics=compute_metrics,
    )
    metrics = trainer.evaluate()
    logits = trainer.predict(validation).predictions
    result = {"metrics": metrics, "logits": np.asarray(logits).tolist(), "argv": sys.argv, "name": __name__}
    os.makedirs(training_args.output_dir, exist_ok=True)
    with open(os.path.join(training_args.output_dir, "results.json"), "w") as file:
        json.dump(result, file)


if __name__ == "__main__":
    main()
