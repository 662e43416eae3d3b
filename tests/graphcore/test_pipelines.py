"""`optimum.graphcore.pipeline`: inference on the simulated IPU equals the plain model's pipeline.

Mirrors optimum_ipu/compat/pipelines.py and question_answering.py. transformers v5 has no extractive
question-answering pipeline, so that one is checked against the best span computed directly from the
plain model's logits.
"""

import numpy as np
import pytest
import torch
import transformers
from fixtures import seeded, tiny_bert_config, tiny_image_processor, tiny_tokenizer, tiny_vit_config
from PIL import Image
from transformers import BertForQuestionAnswering, ViTForImageClassification

from optimum.graphcore import IPUConfig, pipeline
from optimum_ipu.configuration import IPUConfigError

CONTEXT = "alice was born in paris . bob lives in rome . carol works at berlin ."
QUESTIONS = ["where was alice born ?", "who lives in rome ?", "what city is the capital ?"]
TWO_IPUS = IPUConfig(layers_per_ipu=[1, 3], ipus_per_replica=2, inference_layers_per_ipu=[2, 2])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def qa_model() -> BertForQuestionAnswering:
    seeded(0)
    return BertForQuestionAnswering(tiny_bert_config()).eval()


def best_span(model, tokenizer, question, context, max_answer_len=15, **windows):
    """The reference: the highest p(start) x p(end) span inside the context over all windows, from the plain
    model (`windows`: max_length and stride for a context longer than one window)."""
    if windows:
        windows = dict(truncation="only_second", return_overflowing_tokens=True, padding=True, **windows)
    encoded = tokenizer(question, context, return_offsets_mapping=True, return_tensors="pt", **windows)
    offsets = encoded.pop("offset_mapping")
    encoded.pop("overflow_to_sample_mapping", None)
    with torch.no_grad():
        out = model(**encoded)
    best = (-1.0, 0, 0)
    for w in range(len(offsets)):
        in_context = torch.tensor([s == 1 for s in encoded.sequence_ids(w)])
        p_start = out.start_logits[w].masked_fill(~in_context, -torch.inf).softmax(-1)
        p_end = out.end_logits[w].masked_fill(~in_context, -torch.inf).softmax(-1)
        for s in range(len(p_start)):
            for e in range(s, min(s + max_answer_len, len(p_end))):
                score = float(p_start[s] * p_end[e])
                if score > best[0]:
                    best = (score, int(offsets[w, s, 0]), int(offsets[w, e, 1]))
    score, start, end = best
    return {"score": score, "start": start, "end": end, "answer": context[start:end]}


def test_question_answering_in_fp32_gives_the_plain_models_answers(tokenizer):
    reference = qa_model()
    qa = pipeline(
        "question-answering", model=qa_model(), tokenizer=tokenizer, ipu_config=TWO_IPUS, fp16=False
    )
    assert qa.ipu_config.layers_per_ipu == [2, 2]  # the inference layout places the model
    assert [b.ipu for b in qa.ipu.pipelined.plan.layer_blocks] == [0, 0, 1, 1]
    for question in QUESTIONS:
        got = qa(question=question, context=CONTEXT)
        expected = best_span(reference, tokenizer, question, CONTEXT)
        assert (got["answer"], got["start"], got["end"]) == (
            expected["answer"],
            expected["start"],
            expected["end"],
        )
        assert got["score"] == pytest.approx(expected["score"], rel=1e-5)


def test_the_pipelines_model_answers_poptorchs_device_calls(tokenizer):
    """Optimum Graphcore's notebooks free IPUs with `pipeline(...).model.detachFromDevice()` (the model was a
    poptorch.inferenceModel there): PopTorch's states and errors, and the next call attaches again."""
    import poptorch

    qa = pipeline("question-answering", model=qa_model(), tokenizer=tokenizer, ipu_config=TWO_IPUS, fp16=False)
    with pytest.raises(poptorch.Error, match="has not been compiled"):
        qa.model.detachFromDevice()
    first = qa(question=QUESTIONS[0], context=CONTEXT)
    assert qa.model.isCompiled() and qa.model.isAttachedToDevice()
    qa.model.detachFromDevice()
    assert not qa.model.isAttachedToDevice()
    with pytest.raises(poptorch.Error, match="Device is not attached"):
        qa.model.detachFromDevice()
    assert qa(question=QUESTIONS[0], context=CONTEXT) == first
    assert qa.model.isAttachedToDevice()
    with pytest.raises(poptorch.Error, match="already attached"):
        qa.model.attachToDevice()
    qa.model.destroy()
    assert not qa.model.isCompiled()
    assert qa(question=QUESTIONS[0], context=CONTEXT) == first and qa.model.isCompiled()


def test_question_answering_input_forms_and_options(tokenizer):
    qa = pipeline(
        "question-answering", model=qa_model(), tokenizer=tokenizer, ipu_config=TWO_IPUS, fp16=False
    )
    one = qa(question=QUESTIONS[0], context=CONTEXT)
    assert qa({"question": QUESTIONS[0], "context": CONTEXT}) == one
    assert qa(question=QUESTIONS[:2], context=[CONTEXT, CONTEXT])[0] == one
    top = qa(question=QUESTIONS[0], context=CONTEXT, top_k=3)
    assert len(top) == 3 and top[0] == one and top[0]["score"] >= top[1]["score"] >= top[2]["score"]
    short = qa(question=QUESTIONS[0], context=CONTEXT, max_answer_len=1)
    assert len(short["answer"].split()) == 1
    with_null = qa(question=QUESTIONS[0], context=CONTEXT, handle_impossible_answer=True)
    assert with_null["score"] < one["score"]  # [CLS] now takes part of the probability
    with pytest.raises(ValueError, match="batch_size"):
        qa(question=QUESTIONS[0], context=CONTEXT, batch_size=2)
    with pytest.raises(TypeError, match="question"):
        qa({"query": "x"})


def test_the_empty_answer_wins_when_cls_scores_best(tokenizer):
    qa = pipeline(
        "question-answering", model=qa_model(), tokenizer=tokenizer, ipu_config=TWO_IPUS, fp16=False
    )
    logits = torch.zeros(1, 6)
    logits[0, 0] = 10.0  # [CLS]
    outputs = {"start_logits": logits, "end_logits": logits.clone(), "meta": {
        "context": "bob rome", "offsets": [[[0, 0], [0, 0], [0, 0], [0, 3], [4, 8], [0, 0]]],
        "in_context": [[False, False, False, True, True, False]]}}  # fmt: skip
    assert qa.postprocess(outputs, handle_impossible_answer=True)["answer"] == ""
    assert qa.postprocess(outputs)["answer"] in ("bob", "rome", "bob rome")


def test_a_long_context_is_read_in_overlapping_windows_in_one_host_call(tokenizer):
    reference = qa_model()
    qa = pipeline(
        "question-answering", model=qa_model(), tokenizer=tokenizer, ipu_config=TWO_IPUS, fp16=False
    )
    calls = []

    class Spy(type(qa.ipu)):
        def __call__(self, x):
            calls.append(x["input_ids"].shape)
            return super().__call__(x)

    qa.ipu.__class__ = Spy
    long_context = " ".join([CONTEXT] * 12)
    got = qa(question=QUESTIONS[1], context=long_context, max_seq_len=48, doc_stride=16)
    assert len(calls) == 1 and calls[0][0] > 1  # every window of the question in one batch
    expected = best_span(reference, tokenizer, QUESTIONS[1], long_context, max_length=48, stride=16)
    assert (got["answer"], got["start"], got["end"]) == (
        expected["answer"],
        expected["start"],
        expected["end"],
    )
    assert got["score"] == pytest.approx(expected["score"], rel=1e-5)


def test_question_answering_in_fp16_runs_the_model_in_half(tokenizer):
    reference = best_span(qa_model(), tokenizer, QUESTIONS[0], CONTEXT)
    qa = pipeline("question-answering", model=qa_model(), tokenizer=tokenizer, ipu_config=TWO_IPUS)
    assert next(qa.model.parameters()).dtype == torch.float16
    got = qa(question=QUESTIONS[0], context=CONTEXT)
    assert got["score"] == pytest.approx(reference["score"], rel=2e-2)
    assert CONTEXT[got["start"] : got["end"]] == got["answer"] != ""


def test_models_and_tokenizers_load_from_a_path(tmp_path, tokenizer):
    qa_model().save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    qa = pipeline("question-answering", model=str(tmp_path), ipu_config=TWO_IPUS, fp16=False)
    got, expected = (
        qa(question=QUESTIONS[0], context=CONTEXT),
        best_span(qa_model(), tokenizer, QUESTIONS[0], CONTEXT),
    )
    assert got == expected | {"score": pytest.approx(expected["score"], rel=1e-5)}


def images(count=3):
    rng = np.random.default_rng(0)
    return [Image.fromarray((rng.random((40, 40, 3)) * 255).astype("uint8")) for _ in range(count)]


def vit_model() -> ViTForImageClassification:
    seeded(0)
    return ViTForImageClassification(tiny_vit_config(num_labels=5)).eval()


def test_image_classification_in_fp32_equals_transformers_pipeline():
    plain = transformers.pipeline("image-classification", model=vit_model(), image_processor=tiny_image_processor(),
                                  device="cpu")  # fmt: skip
    ipu = pipeline("image-classification", model=vit_model(), feature_extractor=tiny_image_processor(),
                   ipu_config=TWO_IPUS, fp16=False)  # fmt: skip
    for image in images():
        expected, got = plain(image, top_k=5), ipu(image, top_k=5)
        assert [r["label"] for r in got] == [r["label"] for r in expected]
        np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in expected], rtol=1e-5)
    assert len(ipu(images(), top_k=2)) == 3  # a list of images: one result each


def test_image_classification_in_fp16():
    plain = transformers.pipeline("image-classification", model=vit_model(), image_processor=tiny_image_processor(),
                                  device="cpu")  # fmt: skip
    ipu = pipeline("image-classification", model=vit_model(), image_processor=tiny_image_processor(),
                   ipu_config=TWO_IPUS)  # fmt: skip
    assert ipu.model.dtype == torch.float16
    image = images(1)[0]
    expected = {r["label"]: r["score"] for r in plain(image, top_k=5)}
    for result in ipu(image, top_k=5):
        assert result["score"] == pytest.approx(expected[result["label"]], abs=5e-3)


def test_unsupported_tasks_name_the_supported_ones():
    with pytest.raises(
        ValueError, match="supported tasks: audio-classification, automatic-speech-recognition, fill-mask"
    ):
        pipeline("depth-estimation", model=qa_model())
    with pytest.raises(ValueError, match="Pass the task"):
        pipeline(model="x")


def test_a_config_that_does_not_fit_the_model_says_what_to_change(tokenizer):
    with pytest.raises(IPUConfigError, match="does not fit BertForQuestionAnswering.*layers_per_ipu"):
        pipeline("question-answering", model=qa_model(), tokenizer=tokenizer,
                 ipu_config=IPUConfig(layers_per_ipu=[3, 3], ipus_per_replica=2))  # fmt: skip
    with pytest.raises(ValueError, match="tokenizer"):
        pipeline("question-answering", model=qa_model(), ipu_config=TWO_IPUS)


def test_the_callers_config_is_left_as_it_was(tokenizer):
    config = IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2, inference_device_iterations=4)
    qa = pipeline("question-answering", model=qa_model(), tokenizer=tokenizer, ipu_config=config.to_dict())
    assert qa.ipu_config.device_iterations == 1 and qa.ipu_config.mode == "inference"
    pipeline("question-answering", model=qa_model(), tokenizer=tokenizer, ipu_config=config)
    assert config.inference_device_iterations == 4 and config.mode == "training"
