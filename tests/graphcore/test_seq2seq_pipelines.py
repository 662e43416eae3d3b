"""`optimum.graphcore.pipeline` for summarization, translation and text2text-generation (transformers v5
removed these pipelines; optimum_ipu/compat/seq2seq_pipelines.py): the answers equal the plain model's
`generate()` on the unpadded input, decoded, on the same tiny model."""

import pytest
import torch
from fixtures import seeded, tiny_bart_config, tiny_t5_config, tiny_tokenizer
from transformers import BartForConditionalGeneration, T5ForConditionalGeneration

from optimum.graphcore import IPUConfig, pipeline
from optimum.graphcore.pipelines import IPUSummarizationPipeline, IPUTranslationPipeline

TEXTS = ["alice was born in paris and lives in rome .", "bob works at the river seine in france ."]
TWO_IPUS = IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def bart():
    seeded(0)
    return BartForConditionalGeneration(tiny_bart_config(vocab_size=128)).eval()


def t5():
    seeded(0)
    model = T5ForConditionalGeneration(tiny_t5_config(vocab_size=128)).eval()
    model.config.task_specific_params = {"translation_en_to_fr": {"prefix": "the capital of "}}
    return model


def expected(model, tokenizer, texts, prefix="", key="summary_text", **generate):
    """The plain model's answer: each text tokenized alone (no padding), generated, decoded."""
    answers = []
    for text in texts:
        ids = tokenizer(prefix + text, return_tensors="pt")
        ids.pop("token_type_ids", None)
        tokens = model.generate(**ids, **generate)[0]
        answers.append({key: tokenizer.decode(tokens, skip_special_tokens=True)})
    return answers


@pytest.mark.parametrize("beams", [1, 2], ids=["greedy", "beam"])
def test_summarization_equals_the_plain_model(tokenizer, beams):
    ipu = pipeline("summarization", model=bart(), tokenizer=tokenizer, ipu_config=TWO_IPUS, fp16=False)
    assert isinstance(ipu, IPUSummarizationPipeline)
    got = ipu(TEXTS, num_beams=beams)
    assert got == expected(
        bart(), tokenizer, TEXTS, max_length=20, num_beams=beams
    )  # 20 tokens: the original's default
    assert ipu(TEXTS[0], num_beams=beams) == [got[0]]
    assert ipu.ipu.compiled is not None  # the first call compiled the placed model
    assert [b.ipu for b in ipu.ipu.pipelined.plan.layer_blocks] == [0, 0, 1, 1]


def test_inputs_are_padded_to_max_input_length_tokens(tokenizer):
    ipu = pipeline("summarization", model=bart(), tokenizer=tokenizer, ipu_config=TWO_IPUS, fp16=False)
    shapes = []
    hook = ipu.model.get_encoder().register_forward_pre_hook(
        lambda _m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    ipu(TEXTS[0])
    ipu(TEXTS[0], max_input_length=12)
    hook.remove()
    assert set(shapes[:-1]) == {(1, 50)} and shapes[-1] == (1, 12)  # 50: Optimum Graphcore's default
    tokens = ipu(TEXTS[0], return_tensors=True, max_new_tokens=3)[0]["summary_token_ids"]
    assert len(tokens) <= 4


def test_translation_takes_the_languages_prefix_and_text2text_the_models(tokenizer):
    ipu = pipeline("translation_en_to_fr", model=t5(), tokenizer=tokenizer, ipu_config=TWO_IPUS, fp16=False)
    assert isinstance(ipu, IPUTranslationPipeline)
    assert ipu(TEXTS) == expected(
        t5(), tokenizer, TEXTS, "the capital of ", "translation_text", max_length=50
    )

    model = t5()
    model.config.prefix = "what is "
    text2text = pipeline(
        "text2text-generation", model=model, tokenizer=tokenizer, ipu_config=TWO_IPUS, fp16=False
    )
    assert text2text(TEXTS, max_new_tokens=6) == expected(
        t5(), tokenizer, TEXTS, "what is ", "generated_text", max_new_tokens=6
    )


def test_fp16_summarization_runs_the_model_in_half(tokenizer):
    ipu = pipeline("summarization", model=bart(), tokenizer=tokenizer, ipu_config=TWO_IPUS)
    assert ipu.model.dtype == torch.float16
    assert isinstance(ipu(TEXTS[0], max_new_tokens=4)[0]["summary_text"], str)
