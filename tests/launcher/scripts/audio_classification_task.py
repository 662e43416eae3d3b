"""An audio-classification script in the style of 0.7's run_audio_classification.py, for the launcher's tests.

Uses what that script uses: `load_dataset(FOLDER, split=..., use_auth_token=None)` of an `audiofolder`,
`AutoFeatureExtractor.from_pretrained(..., return_attention_mask=True)`, `cast_column` to the extractor's
`Audio(sampling_rate=...)`, `audio["array"]` padded to a fixed length (fp16 inputs unless --fp32),
`evaluate.load("accuracy")`, a frozen feature encoder and `IPUTrainer(..., tokenizer=feature_extractor)`.
With --plain_trainer, transformers' own `Trainer` runs instead (the reference). Writes the train and
eval metrics to OUTPUT_DIR/results.json.
"""

import json
import os
from dataclasses import dataclass, field

import datasets
import evaluate
import numpy as np
import transformers
from datasets import DatasetDict, load_dataset
from transformers import (
    AutoConfig,
    AutoFeatureExtractor,
    AutoModelForAudioClassification,
    HfArgumentParser,
    set_seed,
)
from transformers.utils import send_example_telemetry

from optimum.graphcore import IPUConfig, IPUTrainer
from optimum.graphcore import IPUTrainingArguments as TrainingArguments


@dataclass
class TaskArguments:
    dataset_name: str = field(default=None, metadata={"help": "An audiofolder: split/label/clip.wav."})
    model_name_or_path: str = field(default=None, metadata={"help": "Local model folder."})
    max_length_seconds: float = field(default=0.25, metadata={"help": "Clips are padded to this length."})
    use_auth_token: bool = field(default=False, metadata={"help": "As in the examples."})
    plain_trainer: bool = field(
        default=False, metadata={"help": "transformers' Trainer instead of IPUTrainer."}
    )


def main():
    task_args, training_args = HfArgumentParser(
        (TaskArguments, TrainingArguments)
    ).parse_args_into_dataclasses()
    send_example_telemetry("audio_classification_task", task_args)
    set_seed(training_args.seed)  # before the model is made: a head it initialises is the same in every run
    token = True if task_args.use_auth_token else None
    raw = DatasetDict(
        {
            "train": load_dataset(task_args.dataset_name, split="train", use_auth_token=token),
            "eval": load_dataset(task_args.dataset_name, split="validation", use_auth_token=token),
        }
    )
    extractor = AutoFeatureExtractor.from_pretrained(
        task_args.model_name_or_path, return_attention_mask=True, use_auth_token=token
    )
    raw = raw.cast_column("audio", datasets.features.Audio(sampling_rate=extractor.sampling_rate))
    labels = raw["train"].features["label"].names
    accuracy = evaluate.load("accuracy")

    def compute_metrics(prediction):
        return accuracy.compute(
            predictions=np.argmax(prediction.predictions, axis=1), references=prediction.label_ids
        )

    config = AutoConfig.from_pretrained(
        task_args.model_name_or_path,
        num_labels=len(labels),
        label2id={name: str(i) for i, name in enumerate(labels)},
        id2label={str(i): name for i, name in enumerate(labels)},
        use_auth_token=token,
    )
    config.mask_time_prob = 0.0
    model = AutoModelForAudioClassification.from_pretrained(
        task_args.model_name_or_path, config=config, use_auth_token=token
    )
    model.freeze_feature_encoder()
    length = int(round(extractor.sampling_rate * task_args.max_length_seconds))

    def preprocess(example):
        audio = example["audio"]
        features = extractor(
            audio["array"][:length],
            sampling_rate=audio["sampling_rate"],
            max_length=length,
            padding="max_length",
        )
        values = features["input_values"][0]
        return {
            "input_values": values if training_args.fp32 else values.astype(np.float16),
            "labels": example["label"],
        }

    processed = {
        name: split.map(preprocess, remove_columns=split.column_names) for name, split in raw.items()
    }
    common = dict(
        model=model,
        args=training_args,
        train_dataset=processed["train"],
        eval_dataset=processed["eval"],
        compute_metrics=compute_metrics,
    )
    if task_args.plain_trainer:
        trainer = transformers.Trainer(processing_class=extractor, **common)
    else:
        ipu_config = IPUConfig.from_pretrained(training_args.ipu_config_name, use_auth_token=token)
        trainer = IPUTrainer(ipu_config=ipu_config, tokenizer=extractor, **common)
    train_metrics = trainer.train().metrics
    eval_metrics = trainer.evaluate()
    os.makedirs(training_args.output_dir, exist_ok=True)
    with open(os.path.join(training_args.output_dir, "results.json"), "w") as file:
        json.dump({"train": train_metrics, "eval": eval_metrics, "labels": labels}, file)


if __name__ == "__main__":
    main()
