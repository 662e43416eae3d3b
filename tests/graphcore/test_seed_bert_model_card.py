"""Seed 001: the Graphcore/bert-base-uncased-squad model card's training command, with only the
original `optimum.graphcore` imports.

The card runs Optimum Graphcore's `examples/question-answering/run_qa.py`. This test is that
script's IPU path in miniature, written as such scripts are: its argument dataclasses and
`IPUTrainingArguments` from `optimum.graphcore` parse the card's command line flag for flag
(`--pod_type pod16`, `--loss_scaling 64`, `--warmup_ratio`, `--ipu_config_overrides`, ...),
`optimum.graphcore.utils.check_min_version` passes, the IPU config comes from
`IPUConfig.from_pretrained(ipu_config_name)` (bundled, offline), and `IPUTrainer(..., tokenizer=...)`
trains and evaluates. What changes: a local 12-layer tiny BERT and generated SQuAD files, sequence
length 64, one step, no loader workers, and `--fp32`, which keeps 64 micro-batches
within seconds on a CPU (fp16 training is tested in tests/runtime and tests/test_trainer.py). (examples/question-answering/run_qa.py itself runs the same
command in tests/examples/test_run_qa.py.)
"""

import json
import logging
from dataclasses import dataclass, field

import datasets
import numpy as np
import pytest
from fixtures import tiny_qa_model_dir, write_synthetic_squad
from transformers import AutoModelForQuestionAnswering, AutoTokenizer, HfArgumentParser, default_data_collator

from optimum.graphcore import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum.graphcore.utils import check_min_version

# The model card's command line, model and data replaced by local paths below; sizes made tiny.
MODEL_CARD_FLAGS = [
    "--ipu_config_name", "Graphcore/bert-base-ipu", "--do_train", "--do_eval", "--num_train_epochs", "3",
    "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2",
    "--gradient_accumulation_steps", "16", "--pod_type", "pod16", "--learning_rate", "9e-5",
    "--max_seq_length", "384", "--doc_stride", "128", "--seed", "42", "--lr_scheduler_type", "linear",
    "--loss_scaling", "64", "--weight_decay", "0.01", "--warmup_ratio", "0.2", "--logging_steps", "1",
    "--save_steps", "50", "--dataloader_num_workers", "64",
    "--ipu_config_overrides", "embedding_serialization_factor=2",
]  # fmt: skip
TINY = {"--max_seq_length": "64", "--doc_stride": "32", "--dataloader_num_workers": "0"}


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "Model name or path."})
    cache_dir: str | None = field(default=None, metadata={"help": "Hub cache folder."})
    model_revision: str = field(default="main", metadata={"help": "Model revision."})
    use_auth_token: bool = field(default=False, metadata={"help": "Use the Hub token."})


@dataclass
class DataTrainingArguments:
    train_file: str | None = field(default=None, metadata={"help": "SQuAD-format JSON training file."})
    validation_file: str | None = field(default=None, metadata={"help": "SQuAD-format JSON validation file."})
    max_seq_length: int = field(default=384, metadata={"help": "Tokens per feature."})
    doc_stride: int = field(default=128, metadata={"help": "Overlap of a long context's windows."})


def squad_features(examples, tokenizer, max_length, stride):
    """Training features with start/end token positions (the card's script does the same, at more length)."""
    encoded = tokenizer(
        examples["question"], examples["context"], truncation="only_second", max_length=max_length, stride=stride,
        return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length",
    )  # fmt: skip
    starts, ends = [], []
    for i, offsets in enumerate(encoded.pop("offset_mapping")):
        answer = examples["answers"][encoded["overflow_to_sample_mapping"][i]]
        first = answer["answer_start"][0]
        last = first + len(answer["text"][0])
        context = [k for k, s in enumerate(encoded.sequence_ids(i)) if s == 1]
        inside = offsets[context[0]][0] <= first and offsets[context[-1]][1] >= last
        starts.append(next(k for k in context if offsets[k][1] > first) if inside else 0)
        ends.append(max(k for k in context if offsets[k][0] < last) if inside else 0)
    encoded.pop("overflow_to_sample_mapping")
    return {**encoded, "start_positions": starts, "end_positions": ends}


def load_squad_file(path):
    rows = []
    for article in json.loads(open(path).read())["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = {
                    "text": [a["text"] for a in qa["answers"]],
                    "answer_start": [a["answer_start"] for a in qa["answers"]],
                }
                rows.append({"question": qa["question"], "context": paragraph["context"], "answers": answers})
    return datasets.Dataset.from_list(rows)


@pytest.fixture(scope="module")
def command(tmp_path_factory):
    root = tmp_path_factory.mktemp("seed001")
    model = tiny_qa_model_dir(root / "model", num_hidden_layers=12)  # bert-base-ipu places 12 layers
    data = write_synthetic_squad(root / "data", train_questions=150, validation_questions=10)
    flags = [TINY.get(previous, flag) for previous, flag in zip([None, *MODEL_CARD_FLAGS], MODEL_CARD_FLAGS)]
    return ["--model_name_or_path", str(model), "--train_file", str(data["train"]),
            "--validation_file", str(data["validation"]), *flags, "--max_steps", "1",
            "--output_dir", str(root / "squad_v2_bert_base"), "--fp32"]  # fmt: skip


def test_seed_001_model_card_command_runs_with_the_original_imports(command):
    check_min_version("0.6.0.dev0")  # what Optimum Graphcore's example scripts ask for
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, IPUTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses(command)
    assert training_args.pod_type == "pod16" and training_args.loss_scaling == 64

    ipu_config = IPUConfig.from_pretrained(
        training_args.ipu_config_name or model_args.model_name_or_path,
        cache_dir=model_args.cache_dir,
        revision=model_args.model_revision,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForQuestionAnswering.from_pretrained(model_args.model_name_or_path)

    def prepare(split):
        raw = load_squad_file(getattr(data_args, f"{split}_file"))
        return raw.map(squad_features, batched=True, remove_columns=raw.column_names,
                       fn_kwargs={"tokenizer": tokenizer, "max_length": data_args.max_seq_length,
                                  "stride": data_args.doc_stride})  # fmt: skip

    trainer = IPUTrainer(
        model=model,
        ipu_config=ipu_config,
        args=training_args,
        train_dataset=prepare("train"),
        eval_dataset=prepare("validation"),
        tokenizer=tokenizer,
        data_collator=default_data_collator,
    )
    # The card's arithmetic: pod16 = 4 replicas of bert-base-ipu's 4 IPUs; total train batch 2 x 16 x 4 = 128.
    config = trainer.ipu_config
    assert (
        config.replication_factor,
        config.gradient_accumulation_steps,
        config.embedding_serialization_factor,
    ) == (4, 16, 2)
    assert config.layers_per_ipu == [0, 4, 4, 4]
    assert training_args.per_device_train_batch_size * config.batch_size_factor() == 128

    result = trainer.train()
    assert result.global_step == 1 and np.isfinite(result.training_loss)
    metrics = trainer.evaluate()
    assert np.isfinite(metrics["eval_loss"])
    trainer.save_model()
    saved = json.loads(
        training_args.output_dir and open(f"{training_args.output_dir}/ipu_config.json").read()
    )
    assert saved["embedding_serialization_factor"] == 2


def test_ipu_config_from_pretrained_accepts_the_original_use_auth_token_keyword(caplog, monkeypatch):
    """Optimum Graphcore's run_qa.py passes `use_auth_token=`: it is read as `token=`, not as an attribute."""
    import optimum_ipu.configuration.hub

    config = IPUConfig.from_pretrained("Graphcore/bert-base-ipu", use_auth_token=None)
    assert "use_auth_token" not in config.to_dict()
    seen = []
    resolve = optimum_ipu.configuration.hub.resolve_config_file
    monkeypatch.setattr(
        optimum_ipu.configuration.hub,
        "resolve_config_file",
        lambda *a, **k: seen.append(k["token"]) or resolve(*a, **k),
    )
    IPUConfig.from_pretrained("Graphcore/bert-base-ipu", use_auth_token="hf_old")
    IPUConfig.from_pretrained(
        "Graphcore/bert-base-ipu", token="hf_new", use_auth_token=True
    )  # True: "a token"
    assert seen == ["hf_old", "hf_new"]
    with caplog.at_level(logging.WARNING, logger="optimum_ipu.configuration"):
        IPUConfig.from_pretrained("Graphcore/bert-base-ipu", use_auth_token=False)
    assert "read as `token=`" in caplog.text
    with pytest.raises(ValueError, match="not both"):
        IPUConfig.from_pretrained("Graphcore/bert-base-ipu", token="a", use_auth_token="b")
