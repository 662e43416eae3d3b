"""`optimum.graphcore.pipeline` for the text tasks Optimum Graphcore had: the answers equal plain transformers'
`pipeline()` on the same tiny model and inputs (optimum_ipu/compat/pipelines.py, text_pipelines.py).

The IPU pipelines pad every input to 128 tokens by default (static shapes, as in the original); the
plain pipelines do not pad, so equal answers also show that the padding changes nothing.
"""

import pytest
import torch
import transformers
from fixtures import assert_same_answers as assert_same
from fixtures import seeded, tiny_bert_config, tiny_tokenizer
from transformers import (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2TokenizerFast,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from optimum.graphcore import IPUConfig, IPUFillMaskPipeline, IPUTokenClassificationPipeline, pipeline
from optimum.graphcore.pipelines import IPUZeroShotClassificationPipeline, list_tasks
from optimum_ipu.compat.pipelines import IPUInference

TWO_IPUS = IPUConfig(layers_per_ipu=[1, 3], ipus_per_replica=2, inference_layers_per_ipu=[2, 2])
SENTENCES = ["alice was born in paris .", "bob lives in rome and works at berlin .", "the river seine"]
LABELS = {0: "contradiction", 1: "neutral", 2: "entailment"}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def model(cls, **config):
    seeded(0)
    return cls(tiny_bert_config(**config)).eval()


class CountedIPU(IPUInference):
    """The pipeline's IPU, counting its host calls: the answers must come from the IPU."""

    calls = 0

    def __call__(self, inputs):
        self.calls += 1
        return super().__call__(inputs)


def both(task, cls, tokenizer, config=None, **options):
    """The plain transformers pipeline and ours, on two copies of the same model, fp32."""
    config = config or {}
    plain = transformers.pipeline(
        task, model=model(cls, **config), tokenizer=tokenizer, device="cpu", **options
    )
    ipu = pipeline(
        task, model=model(cls, **config), tokenizer=tokenizer, ipu_config=TWO_IPUS, fp16=False, **options
    )
    ipu.ipu.__class__ = CountedIPU
    return plain, ipu


def assert_from_ipu(ipu, calls):
    assert ipu.ipu.calls == calls, f"{ipu.ipu.calls} host calls, expected {calls}"


def test_the_tasks_and_aliases_of_optimum_graphcore_are_listed():
    assert list_tasks() == [
        "audio-classification", "automatic-speech-recognition", "fill-mask", "image-classification", "ner", "question-answering", "sentiment-analysis", "summarization",
        "text-classification", "text-generation", "text2text-generation", "token-classification", "translation",
        "zero-shot-classification",
    ]  # fmt: skip


@pytest.mark.parametrize("task", ["text-classification", "sentiment-analysis"])
def test_text_classification_equals_transformers(tokenizer, task):
    plain, ipu = both(task, BertForSequenceClassification, tokenizer, {"num_labels": 3})
    assert [b.ipu for b in ipu.ipu.pipelined.plan.layer_blocks] == [0, 0, 1, 1]
    assert_same(ipu(SENTENCES), plain(SENTENCES))
    assert_same(ipu(SENTENCES, top_k=None), plain(SENTENCES, top_k=None))
    assert_same(
        ipu(SENTENCES[0], function_to_apply="sigmoid"), plain(SENTENCES[0], function_to_apply="sigmoid")
    )
    assert_from_ipu(ipu, 7)


def test_inputs_are_padded_to_128_tokens_by_default_as_in_optimum_graphcore(tokenizer):
    ipu = pipeline("text-classification", model=model(BertForSequenceClassification), tokenizer=tokenizer,
                   ipu_config=TWO_IPUS, fp16=False)  # fmt: skip
    shapes = []

    class Spy(IPUInference):
        def __call__(self, x):
            shapes.append(x["input_ids"].shape)
            return super().__call__(x)

    ipu.ipu.__class__ = Spy
    ipu(SENTENCES)
    assert shapes == [(1, 128)] * 3
    ipu(" ".join(["paris"] * 300))  # a longer input is cut to 128
    assert shapes[-1] == (1, 128)
    shorter = pipeline("text-classification", model=model(BertForSequenceClassification), tokenizer=tokenizer,
                       ipu_config=TWO_IPUS, fp16=False, max_length=16)  # fmt: skip
    assert shorter.preprocess(SENTENCES[0], **shorter._preprocess_params)["input_ids"].shape == (1, 16)
    unpadded = pipeline("text-classification", model=model(BertForSequenceClassification), tokenizer=tokenizer,
                        ipu_config=TWO_IPUS, fp16=False, padding=False)  # fmt: skip
    assert unpadded.preprocess(SENTENCES[0], **unpadded._preprocess_params)["input_ids"].shape == (1, 8)


@pytest.mark.parametrize("aggregation", [None, "simple", "first"])
def test_token_classification_equals_transformers(tokenizer, aggregation):
    options = {} if aggregation is None else {"aggregation_strategy": aggregation}
    plain, ipu = both("ner", BertForTokenClassification, tokenizer, {"num_labels": 5}, **options)
    assert isinstance(ipu, IPUTokenClassificationPipeline)
    expected = plain(SENTENCES, ignore_labels=[])
    assert len(expected[0]) > 0
    assert_same(ipu(SENTENCES, ignore_labels=[]), expected)
    assert_from_ipu(ipu, 3)


def test_token_classification_takes_the_older_grouped_entities(tokenizer):
    plain, ipu = both("token-classification", BertForTokenClassification, tokenizer, {"num_labels": 5})
    expected = plain(SENTENCES[1], ignore_labels=[], aggregation_strategy="simple")
    assert_same(ipu(SENTENCES[1], ignore_labels=[], grouped_entities=True), expected)
    with pytest.raises(ValueError, match="always truncates"):
        ipu(SENTENCES[1], truncation=True)


def test_fill_mask_equals_transformers(tokenizer):
    plain, ipu = both("fill-mask", BertForMaskedLM, tokenizer)
    assert isinstance(ipu, IPUFillMaskPipeline)
    inputs = ["alice was born in [MASK] .", "bob [MASK] in rome ."]
    assert_same(ipu(inputs), plain(inputs))
    assert_same(
        ipu(inputs[0], top_k=2, targets=["paris", "rome"]),
        plain(inputs[0], top_k=2, targets=["paris", "rome"]),
    )
    # Optimum Graphcore's spelling of tokenizer options, beside transformers' tokenizer_kwargs.
    assert_from_ipu(ipu, 3)
    params = ipu._sanitize_parameters(tokenizer_kwargs={"max_length": 12}, padding="max_length")[0]
    assert ipu.preprocess(inputs[0], **params)["input_ids"].shape == (1, 12)
    assert ipu.preprocess(inputs[0], **ipu._preprocess_params)["input_ids"].shape == (1, 128)  # the default


def test_zero_shot_classification_equals_transformers(tokenizer):
    config = {"num_labels": 3, "id2label": LABELS, "label2id": {v: k for k, v in LABELS.items()}}
    plain, ipu = both("zero-shot-classification", BertForSequenceClassification, tokenizer, config)
    assert isinstance(ipu, IPUZeroShotClassificationPipeline)
    labels = ["city", "river", "color"]
    for multi_label in (False, True):
        expected = plain(SENTENCES, candidate_labels=labels, multi_label=multi_label)
        assert_same(ipu(SENTENCES, candidate_labels=labels, multi_label=multi_label), expected)
    expected = plain(
        SENTENCES[0], candidate_labels=labels, hypothesis_template="it is about {} .", multi_label=True
    )
    assert_same(ipu(SENTENCES[0], candidate_labels=labels, hypothesis_template="it is about {} .", multi_class=True),
                expected)  # fmt: skip
    assert_from_ipu(ipu, 2 * 3 * 3 + 3)  # one host call per (sequence, candidate label) pair
    pair = next(
        iter(ipu.preprocess(SENTENCES[0], candidate_labels=labels, padding="max_length", max_length=128))
    )
    assert pair["input_ids"].shape == (1, 128)


def tiny_gpt2():
    """GPT-2 with 4 layers of width 32 and a byte-level tokenizer (one token per byte, no merges)."""
    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = GPT2TokenizerFast(vocab=vocab, merges=[])
    seeded(0)
    config = GPT2Config(vocab_size=len(vocab), n_positions=128, n_embd=32, n_layer=4, n_head=4,
                        bos_token_id=len(vocab) - 1, eos_token_id=len(vocab) - 1)  # fmt: skip
    return GPT2LMHeadModel(config).eval(), tokenizer


def test_text_generation_equals_transformers_and_stops_at_50_tokens():
    plain_model, tokenizer = tiny_gpt2()
    ipu_model, _ = tiny_gpt2()
    ipu = pipeline("text-generation", model=ipu_model, tokenizer=tokenizer, ipu_config=TWO_IPUS, fp16=False)
    assert tokenizer.pad_token == "<|endoftext|>"  # GPT-2 pads with end-of-text, as in the original
    plain = transformers.pipeline("text-generation", model=plain_model, tokenizer=tokenizer, device="cpu")
    prompts = ["alice was born in", "the capital of"]
    # max_new_tokens=None: transformers 5.18's pipeline otherwise adds max_new_tokens=256, which wins over max_length.
    expected = plain(prompts, max_length=50, max_new_tokens=None, do_sample=False)
    got = ipu(prompts, do_sample=False)
    assert got == expected
    assert len(ipu(prompts[0], do_sample=False, return_tensors=True)[0]["generated_token_ids"]) == 50
    assert ipu(prompts[0], max_new_tokens=5, do_sample=False) == plain(
        prompts[0], max_new_tokens=5, do_sample=False
    )
    assert ipu.ipu.compiled is not None  # the first call compiled the placed model


def test_fp16_pipelines_run_the_model_in_half_and_agree_with_fp32(tokenizer):
    plain, _ = both("fill-mask", BertForMaskedLM, tokenizer)
    ipu = pipeline("fill-mask", model=model(BertForMaskedLM), tokenizer=tokenizer, ipu_config=TWO_IPUS)
    assert ipu.model.dtype == torch.float16
    expected = {r["token"]: r["score"] for r in plain("alice was born in [MASK] .", top_k=128)}
    for result in ipu("alice was born in [MASK] .", top_k=3):
        assert result["score"] == pytest.approx(expected[result["token"]], abs=2e-4)


def test_an_fp16_pipeline_on_a_list_copies_each_weight_once_with_the_same_answers(tokenizer, monkeypatch):
    """Nothing changes the weights between the inputs of one pipeline call: each input's host call reads fp32
    copies made once for the call (`held_fp32_copies`); one input at a time, each call makes its own."""
    from optimum_ipu.runtime import fp16_compute

    monkeypatch.setattr(fp16_compute, "CACHED_WEIGHT_ELEMENTS", 1)  # the tiny model's weights too
    copies = []
    copy = fp16_compute._storage_as_fp32
    monkeypatch.setattr(
        fp16_compute, "_storage_as_fp32", lambda tensor, *into: copies.append(tensor) or copy(tensor, *into)
    )
    ipu = pipeline("text-classification", model=model(BertForSequenceClassification, num_labels=3),
                   tokenizer=tokenizer, ipu_config=TWO_IPUS)  # fmt: skip
    ipu.ipu.__class__ = CountedIPU
    one_by_one = [ipu(sentence) for sentence in SENTENCES]
    per_input = len(copies) // len(SENTENCES)
    copies.clear()
    together = ipu(SENTENCES)
    assert_from_ipu(ipu, 2 * len(SENTENCES))
    assert per_input > 0 and len(copies) == per_input
    assert together == [answers[0] for answers in one_by_one]


def test_a_task_without_ipu_pipeline_names_those_with_one(tokenizer):
    with pytest.raises(
        ValueError, match="supported tasks: audio-classification, .*, zero-shot-classification"
    ):
        pipeline("text-to-audio", model=model(BertForMaskedLM), tokenizer=tokenizer)


def test_a_model_an_ipu_trainer_placed_generates_then_trains_again(tmp_path):
    """Train, then generate with the same model, then train on: each takes the model over from the other
    (the placements differ: the trainer's embedding is serialized), and answers as plain transformers."""
    from optimum_ipu import IPUTrainer, IPUTrainingArguments
    from optimum_ipu.pipelining.serialized import SerializedEmbedding

    ipu_model, tokenizer = tiny_gpt2()
    plain_model, _ = tiny_gpt2()
    config = IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2, embedding_serialization_factor=2,
                       gradient_accumulation_steps=6)
    ids = torch.randint(0, 200, (6, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = IPUTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=1, fp32=True, max_steps=1,
                                report_to="none", save_strategy="no", use_cpu=True, optim="sgd")  # fmt: skip
    trainer = IPUTrainer(ipu_model.train(), config, args, train_dataset=data)
    trainer.train()

    inference = IPUConfig(layers_per_ipu=[1, 3], ipus_per_replica=2, embedding_serialization_factor=4)
    generator = pipeline("text-generation", model=ipu_model.eval(), tokenizer=tokenizer, ipu_config=inference, fp16=False)  # fmt: skip
    plain_model.load_state_dict(ipu_model.state_dict())
    plain = transformers.pipeline("text-generation", model=plain_model, tokenizer=tokenizer, device="cpu")
    assert generator("alice was", max_new_tokens=5, do_sample=False) == plain(
        "alice was", max_new_tokens=5, do_sample=False
    )

    trainer.train()  # the trainer's layout again: the embedding serialized as its config says
    assert isinstance(ipu_model.transformer.wte, SerializedEmbedding) and ipu_model.transformer.wte.factor == 2
    assert ipu_model.training
    plain_model.load_state_dict(ipu_model.state_dict())  # the weights of two updates
    assert generator("alice was", max_new_tokens=5, do_sample=False) == plain(
        "alice was", max_new_tokens=5, do_sample=False
    )
    assert ipu_model.transformer.wte.factor == 4 and not ipu_model.training  # the pipeline's layout, eval mode
