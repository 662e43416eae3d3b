"""Graphcore's published layouts at their real sizes: every bundled config compiles on IPUTrainer.

Tiny models hide what only binds at size: IPU memory, vocabularies a serialization factor does not
divide, pipelines deepened by a tied head. Each case is the real architecture of a bundled config's
family, built from its config (no download; weights left uninitialised, as nothing is computed),
compiled by IPUTrainer with `compile_only` at a command Graphcore published for it
(`bench/memory_facts.json` holds each command with its source): a layout that ran on IPUs is never
refused, and the memory model does not call it out of memory. Inputs come from a lazy data set, so a
combined batch of thousands of real samples is never built (the compile reads one micro-batch).

`python bench/real_size.py` times these compiles and checks GPT-2's numbers at real size.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from transformers.initialization import no_init_weights

from optimum_ipu import IPUTrainer, IPUTrainingArguments
from optimum_ipu.configuration import load_ipu_config
from optimum_ipu.costmodel.presets import PRESETS
from optimum_ipu.costmodel.trace import sample_inputs_for

FACTS = {
    f["id"]: f for f in json.loads((Path(__file__).parents[1] / "bench" / "memory_facts.json").read_text())
}

# One published command per bundled config (a fact's id), or, for the three configs no published
# training command names, the config as published with a micro-batch of 1 (marked).
CASES = {
    "Graphcore/bert-base-ipu": "readme-bert-base-squad",
    "Graphcore/bert-large-ipu": "readme-bert-large-pretrain-512",
    "Graphcore/vit-base-ipu": "readme-vit-cifar10-mbs17",
    "Graphcore/distilbert-base-ipu": "ci-run_qa-distilbert-train",
    "Graphcore/roberta-base-ipu": "readme-roberta-base-mlm",
    "Graphcore/roberta-large-ipu": dict(model="roberta-large", builder="AutoModelForQuestionAnswering",
                                        micro_batch_size=1, inputs={"seq_len": 384}),
    "Graphcore/gpt2-small-ipu": "readme-gpt2-clm",
    "Graphcore/gpt2-medium-ipu": "readme-gpt2-medium-clm",
    "Graphcore/hubert-base-ipu": "readme-hubert-common-language",
    "Graphcore/wav2vec2-ctc-base-ipu": "ci-run_speech_recognition_ctc-wav2vec2_ctc-train",
    "Graphcore/wav2vec2-ctc-large-ipu": "readme-wav2vec2-large-ctc",
    "Graphcore/mpnet-base-ipu": dict(model="microsoft/mpnet-base", builder="AutoModelForQuestionAnswering",
                                     micro_batch_size=1, inputs={"seq_len": 384}),
    "Graphcore/mt5-small-ipu": "nb-mt5-small-translation-fits",
    "Graphcore/whisper-tiny-ipu": dict(model="openai/whisper-tiny", builder="AutoModelForSpeechSeq2Seq",
                                       micro_batch_size=1, inputs={"seq_len": 128}),
}  # fmt: skip


def case(config_name: str) -> dict:
    """The case's settings: the published fact's, or the config's own at micro-batch 1."""
    spec = CASES[config_name]
    if isinstance(spec, str):
        return {**FACTS[spec], "ipu_config": config_name}
    return {"id": f"{config_name} as published, micro-batch 1", "ipu_config": config_name, "training": True,
            "optimizer": "adamw", "config": {}, **spec}  # fmt: skip


def real_model(settings: dict) -> torch.nn.Module:
    """The real architecture, its weights allocated but not initialised (nothing is computed)."""
    values = {**PRESETS[settings["model"]], **settings.get("config", {})}
    model_type = values.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **values)
    with no_init_weights():
        model = getattr(transformers, settings["builder"]).from_config(config)
    model.tie_weights()  # as loading would: skipping the initialisation skips the tying too
    return model


class LazySamples(torch.utils.data.Dataset):
    """`length` samples shaped as the model reads them (zeros), made when read: a combined batch of a
    published command can hold thousands of samples."""

    def __init__(self, model: torch.nn.Module, settings: dict, length: int):
        shape = settings["inputs"]
        one = sample_inputs_for(
            model, 1, shape.get("seq_len") or shape.get("frames"), shape.get("image_size")
        )
        if shape.get("target_len") and "labels" in one:
            one["labels"] = torch.empty(1, shape["target_len"], dtype=torch.long, device="meta")
        self.shapes = {
            k: (tuple(v.shape[1:]), v.dtype) for k, v in one.items() if isinstance(v, torch.Tensor)
        }
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        return {k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in self.shapes.items()}


def compile_at_real_size(config_name: str, output_dir: str):
    """IPUTrainer's compile of the case: (trainer, settings)."""
    settings = case(config_name)
    ipu_config = load_ipu_config(config_name, n_ipu=settings.get("n_ipu"), changes=settings.get("overrides"))
    model = real_model(settings)
    args = IPUTrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=settings["micro_batch_size"], compile_only=True,
        lamb=settings["optimizer"] == "lamb", report_to="none", dataloader_num_workers=0, use_cpu=True,
        save_strategy="no",
    )  # fmt: skip
    combined = settings["micro_batch_size"] * ipu_config.batch_size_factor()
    trainer = IPUTrainer(model, ipu_config, args, train_dataset=LazySamples(model, settings, combined))
    trainer.train()
    return trainer, settings


@pytest.mark.parametrize("config_name", sorted(CASES))
def test_a_published_layout_compiles_at_its_real_size(tmp_path, config_name):
    trainer, settings = compile_at_real_size(config_name, str(tmp_path))
    memory = trainer.compile_report.memory
    assert not memory.surely_out_of_memory, (
        f"{settings['id']}: a layout that ran is called out of memory\n" + (memory.table())
    )
    assert trainer.compile_report.layers_per_ipu == list(trainer.ipu_config.layers_per_ipu) or -1 in (
        trainer.ipu_config.layers_per_ipu
    )
