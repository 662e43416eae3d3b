"""A text2text-generation pipeline built from names, as flan_t5_inference.ipynb builds one: the model by
name or path, `IPUConfig.from_pretrained(name, executable_cache_dir=...)`, and `max_input_length` given to
`pipeline()`. Lists, strings and a prompt that grows past `max_input_length` (a chat's context) all
answer as the plain model's `generate()` on the same (cut) input (optimum_ipu/compat/seq2seq_pipelines.py).
"""

import pytest
from fixtures import tiny_seq2seq_model_dir, write_ipu_config
from transformers import AutoTokenizer, T5ForConditionalGeneration

from optimum.graphcore import IPUConfig, pipeline

PROMPTS = ["where was alice born ?", "what is the capital of france ?", "bob lives in"]
MAX_INPUT_LENGTH = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_seq2seq_model_dir(tmp_path_factory.mktemp("t5"), model_type="t5", max_length=128)


@pytest.fixture(scope="module")
def text2text(model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ipu")
    ipu_config = IPUConfig.from_pretrained(
        str(write_ipu_config(folder / "config")), executable_cache_dir=str(folder / "exe_cache")
    )
    assert ipu_config.executable_cache_dir == str(folder / "exe_cache")
    return pipeline(
        "text2text-generation",
        model=str(model_dir),
        ipu_config=ipu_config,
        max_input_length=MAX_INPUT_LENGTH,
        fp16=False,
    )


def plain_answer(model_dir, prompt: str) -> str:
    """The plain model on the prompt cut to MAX_INPUT_LENGTH tokens, greedy, up to 50 tokens (the default)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = T5ForConditionalGeneration.from_pretrained(model_dir).eval()
    ids = tokenizer(prompt, truncation=True, max_length=MAX_INPUT_LENGTH, return_tensors="pt")
    ids.pop("token_type_ids", None)
    return tokenizer.decode(model.generate(**ids, max_length=50)[0], skip_special_tokens=True)


def test_lists_and_strings_answer_as_the_plain_model(model_dir, text2text):
    expected = [{"generated_text": plain_answer(model_dir, p)} for p in PROMPTS]
    assert text2text(PROMPTS) == expected
    assert text2text(PROMPTS[1]) == [expected[1]]  # a string: a list of one answer
    assert text2text([PROMPTS[2]])[0]["generated_text"] == expected[2]["generated_text"]


def test_a_growing_chat_context_is_cut_to_max_input_length(model_dir, text2text):
    shapes = []
    hook = text2text.model.get_encoder().register_forward_pre_hook(
        lambda _m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    context = "customer : where was alice born ?\nassistant :"
    for _ in range(3):
        answer = text2text(context)[0]["generated_text"]
        assert answer == plain_answer(model_dir, context)
        context = f"{context} {answer}\ncustomer : what is the capital of france ?\nassistant :"
    hook.remove()
    assert set(shapes) == {(1, MAX_INPUT_LENGTH)}
