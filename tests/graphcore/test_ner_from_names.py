"""A "ner" pipeline as name-entity-extraction.ipynb builds and uses one: a model by name or path, the IPU
config as a dict, `padding="max_length"` and `max_length` given to `pipeline()`, one string per call (a
web app's callback), and `pipeline.model.detachFromDevice()` between apps. The entities equal transformers'
"ner" pipeline on the unpadded input (optimum_ipu/compat/pipelines.py, text_pipelines.py).
"""

import numpy as np
import pytest
import transformers
from fixtures import seeded, tiny_bert_config, tiny_tokenizer
from transformers import BertForTokenClassification

from optimum.graphcore import pipelines

INFERENCE_CONFIG = dict(layers_per_ipu=[2, 2], ipus_per_replica=2, enable_half_partials=True)
TEXTS = ["alice was born in paris and lives in rome .", "bob works at berlin", "carol"]
MAX_LENGTH = 32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ner")
    seeded(0)
    tiny_tokenizer(directory)
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    config = tiny_bert_config(id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    BertForTokenClassification(config).eval().save_pretrained(directory)
    return str(directory)


def test_padded_ner_from_a_name_answers_as_transformers_and_detaches_between_apps(model_dir):
    plain = transformers.pipeline("ner", model=model_dir, device="cpu")
    ner = pipelines.pipeline(
        "ner",
        model=model_dir,
        ipu_config=INFERENCE_CONFIG,
        padding="max_length",
        max_length=MAX_LENGTH,
        fp16=False,
    )
    shapes = []
    hook = ner.model.register_forward_pre_hook(
        lambda _m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    found = 0
    for text in TEXTS:
        got, expected = ner(text), plain(text)
        found += len(got)
        assert [{k: v for k, v in e.items() if k != "score"} for e in got] == [
            {k: v for k, v in e.items() if k != "score"} for e in expected
        ]
        np.testing.assert_allclose([e["score"] for e in got], [e["score"] for e in expected], atol=1e-5)
    hook.remove()
    assert found > 0  # the tiny model tags some words: the comparison is not of empty lists
    assert set(shapes) == {(1, MAX_LENGTH)}

    ner.model.detachFromDevice()
    assert not ner.model.isAttachedToDevice()
    assert ner(TEXTS[1]) == ner(TEXTS[1]) and ner.model.isAttachedToDevice()  # a call attaches again
