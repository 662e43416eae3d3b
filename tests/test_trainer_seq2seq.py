"""IPUSeq2SeqTrainer evaluates by generation as transformers' Seq2SeqTrainer does; generate() on the placed
model (and in the IPU's static form) gives transformers' tokens, greedy and beam search, in fp32."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from fixtures import SyntheticSeq2Seq, tiny_bart_config, tiny_t5_config, tiny_whisper_config
from transformers import (
    BartForConditionalGeneration,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    T5ForConditionalGeneration,
    Trainer,
    TrainingArguments,
    WhisperForConditionalGeneration,
)
from transformers.cache_utils import StaticCache

from optimum_ipu import IPUConfig, IPUSeq2SeqTrainer, IPUSeq2SeqTrainingArguments, IPUTrainingArguments
from optimum_ipu.generation import static_generation
from optimum_ipu.pipelining import to_pipelined

MODELS = {
    "bart": lambda: BartForConditionalGeneration(tiny_bart_config()),
    "t5": lambda: T5ForConditionalGeneration(tiny_t5_config()),
    "whisper": lambda: WhisperForConditionalGeneration(tiny_whisper_config()),
}


def _model(key: str):
    torch.manual_seed(0)
    return MODELS[key]().eval()


def _sources(key: str = "bart"):
    g = torch.Generator().manual_seed(1)
    if key == "whisper":  # a random log-mel spectrogram: 8 mel bins x 32 frames
        return {"input_features": torch.randn(3, 8, 32, generator=g)}
    ids = torch.randint(4, 64, (3, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # one padded source
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("beams", [1, 3], ids=["greedy", "beam"])
@pytest.mark.parametrize("key", list(MODELS))
def test_generate_on_the_placed_model_gives_transformers_tokens(key, beams):
    """On 2 IPUs with the shared embedding serialized, dynamic and static (fixed-size KV cache)."""
    plain = _model(key)
    expected = plain.generate(**_sources(key), max_length=12, num_beams=beams)
    model = copy.deepcopy(plain)
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, embedding_serialization_factor=2).eval()
    to_pipelined(model, config).parallelize()
    assert torch.equal(model.generate(**_sources(key), max_length=12, num_beams=beams), expected)

    seen = []
    hook = model.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw), with_kwargs=True)
    with static_generation(model):
        static = model.generate(**_sources(key), max_length=12, num_beams=beams)
    hook.remove()
    assert torch.equal(static, expected)
    caches = {type(kw.get("cache", kw.get("past_key_values")).self_attention_cache) for kw in seen}
    assert caches == {StaticCache}, caches  # the decoder's self-attention cache had a fixed size
    assert {kw["decoder_input_ids"].shape for kw in seen} == {(3 * beams, 1)}  # one decoder call per token
    assert model.generation_config.cache_implementation is None  # restored


def _metrics(prediction):
    """A metric on generated tokens: how often the first generated token is the target's first."""
    predictions, labels = prediction
    return {"first_token": float(np.mean(predictions[:, 1] == labels[:, 0])), "tokens": predictions.shape[1]}


@pytest.mark.parametrize(("beams", "samples", "iterations"), [(1, 8, 2), (2, 5, 1)], ids=["greedy", "beam"])
def test_predict_with_generate_equals_seq2seq_trainer(tmp_path, beams, samples, iterations):
    """eval_loss, the metrics on generated tokens and the predictions equal a plain Seq2SeqTrainer's, with
    micro-batch 2 x inference device iterations 2, and with a short last batch (5 samples).

    (Not both at once: transformers 5 averages eval_loss over evaluation steps, so a short last call
    of several micro-batches weighs as much as a full one, where a plain Trainer's steps are micro-batches.)"""
    data = SyntheticSeq2Seq(samples, eos=2)
    common = dict(per_device_eval_batch_size=2, report_to="none", use_cpu=True, predict_with_generate=True,
                  generation_max_length=8, generation_num_beams=beams)  # fmt: skip
    plain = Seq2SeqTrainer(_model("bart"), Seq2SeqTrainingArguments(output_dir=str(tmp_path / "p"), **common),
                           compute_metrics=_metrics)  # fmt: skip
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, inference_device_iterations=iterations)
    args = IPUSeq2SeqTrainingArguments(output_dir=str(tmp_path / "i"), fp32=True, **common)
    ipu = IPUSeq2SeqTrainer(_model("bart"), config, args, compute_metrics=_metrics)

    expected, got = plain.predict(data), ipu.predict(data)
    np.testing.assert_array_equal(got.predictions, expected.predictions)
    assert got.predictions.shape[0] == samples
    for name in ("test_loss", "test_first_token", "test_tokens"):
        assert got.metrics[name] == pytest.approx(expected.metrics[name], abs=1e-6), name
    # generate() keywords given to evaluate() reach generate(), as in Seq2SeqTrainer
    one_token = ipu.evaluate(data, max_new_tokens=1)
    assert one_token["eval_loss"] == pytest.approx(expected.metrics["test_loss"], abs=1e-6)


def test_fp16_evaluation_generates(tmp_path):
    """In fp16 (the IPU default) generation runs under the same fp16 compute as the loss."""
    args = IPUSeq2SeqTrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to="none",
                                       use_cpu=True, predict_with_generate=True, generation_max_length=6,
                                       static_generation=True)  # fmt: skip
    trainer = IPUSeq2SeqTrainer(_model("t5"), IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2), args,
                                compute_metrics=_metrics)  # fmt: skip
    metrics = trainer.evaluate(SyntheticSeq2Seq(4, eos=1))
    assert np.isfinite(metrics["eval_loss"]) and metrics["eval_tokens"] >= 6


def test_trains_like_transformers_and_saves_plain_checkpoints(tmp_path):
    """Training is IPUTrainer's: SGD steps over combined batches equal transformers' Trainer's."""
    data = SyntheticSeq2Seq(16, eos=2)
    plain_model, ipu_model = _model("bart").train(), _model("bart").train()
    plain_args = TrainingArguments(output_dir=str(tmp_path / "p"), per_device_train_batch_size=8, learning_rate=0.05,
                                   num_train_epochs=1, report_to="none", use_cpu=True, optim="sgd", save_strategy="no")  # fmt: skip
    Trainer(plain_model, plain_args, train_dataset=data).train()
    args = IPUSeq2SeqTrainingArguments(output_dir=str(tmp_path / "i"), per_device_train_batch_size=1, learning_rate=0.05,
                                       num_train_epochs=1, report_to="none", use_cpu=True, optim="sgd", fp32=True,
                                       save_strategy="no")  # fmt: skip
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=8)
    trainer = IPUSeq2SeqTrainer(ipu_model, config, args, train_dataset=data)
    trainer.train()
    for (name, a), (_, b) in zip(plain_model.named_parameters(), ipu_model.named_parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    trainer.save_model(str(tmp_path / "saved"))
    reloaded = BartForConditionalGeneration.from_pretrained(str(tmp_path / "saved"))
    torch.testing.assert_close(reloaded.lm_head.weight, ipu_model.lm_head.weight)
    assert (tmp_path / "saved" / "ipu_config.json").exists()


def test_arguments_parse_as_flags_and_are_seq2seq_arguments():
    (args,) = HfArgumentParser(IPUSeq2SeqTrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", "o", "--predict_with_generate", "--generation_max_length", "32", "--generation_num_beams",
         "4", "--pod_type", "pod4", "--gradient_accumulation_steps", "8"]
    )  # fmt: skip
    assert isinstance(args, Seq2SeqTrainingArguments) and isinstance(args, IPUTrainingArguments)
    assert (args.predict_with_generate, args.generation_max_length, args.generation_num_beams) == (
        True,
        32,
        4,
    )
    assert (args.n_ipu, args.ipu_gradient_accumulation_steps, args.gradient_accumulation_steps) == (4, 8, 1)


def test_plain_ipu_arguments_are_refused_with_the_class_to_use(tmp_path):
    with pytest.raises(TypeError, match="IPUSeq2SeqTrainingArguments"):
        IPUSeq2SeqTrainer(_model("bart"), IPUConfig(), IPUTrainingArguments(output_dir=str(tmp_path)))


def test_whisper_predict_with_generate_equals_seq2seq_trainer(tmp_path):
    """Speech recognition: generated tokens from log-mel features, as a plain Seq2SeqTrainer generates them."""
    data = SyntheticSeq2Seq(4, eos=3, features=(8, 32))
    common = dict(per_device_eval_batch_size=2, report_to="none", use_cpu=True, predict_with_generate=True,
                  generation_max_length=8)  # fmt: skip
    plain = Seq2SeqTrainer(
        _model("whisper"), Seq2SeqTrainingArguments(output_dir=str(tmp_path / "p"), **common)
    )
    args = IPUSeq2SeqTrainingArguments(output_dir=str(tmp_path / "i"), fp32=True, **common)
    ipu = IPUSeq2SeqTrainer(_model("whisper"), IPUConfig.from_pretrained("Graphcore/whisper-tiny-ipu",
                            layers_per_ipu=[2, 2]), args)  # fmt: skip
    expected, got = plain.predict(data), ipu.predict(data)
    np.testing.assert_array_equal(got.predictions, expected.predictions)
    assert got.metrics["test_loss"] == pytest.approx(expected.metrics["test_loss"], abs=1e-6)


@pytest.mark.parametrize("call", ["predict", "evaluate"])
@pytest.mark.parametrize("beams", [0, -2, 1.5, True])
def test_num_beams_below_1_or_not_an_integer_is_refused_before_generating(tmp_path, call, beams):
    """transformers divides by num_beams deep in generate(): num_beams=0 was a bare ZeroDivisionError."""
    args = IPUSeq2SeqTrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to="none",
                                       use_cpu=True, fp32=True, predict_with_generate=True, generation_max_length=6)  # fmt: skip
    trainer = IPUSeq2SeqTrainer(_model("bart"), IPUConfig(layers_per_ipu=[-1]), args)
    with pytest.raises(ValueError, match=rf"num_beams={beams!r}.*an integer >= 1.*num_beams=1"):
        getattr(trainer, call)(SyntheticSeq2Seq(2, eos=2), num_beams=beams)


@pytest.mark.parametrize("beams", ["0", "-1"])
def test_generation_num_beams_below_1_is_refused_as_a_flag(beams):
    parser = HfArgumentParser(IPUSeq2SeqTrainingArguments)
    with pytest.raises(ValueError, match=rf"--generation_num_beams must be an integer >= 1.*got {beams}.*leave it out"):
        parser.parse_args_into_dataclasses(["--output_dir", "o", "--generation_num_beams", beams])
