"""`pipeline(model=...)` without a task, offline: the task comes from the model's architecture
(optimum_ipu/compat/pipeline_tasks.py), and the pipeline answers as transformers' pipeline with the task
named. Optimum Graphcore asked the Hub; the Hub is still asked first when it can be.
"""

import logging

import pytest
import transformers
from fixtures import (
    assert_same_answers,
    seeded,
    tiny_bert_config,
    tiny_t5_config,
    tiny_tokenizer,
    tiny_vit_config,
    tiny_whisper_config,
)
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    GPT2Config,
    ViTForImageClassification,
)

from optimum.graphcore import pipelines
from optimum_ipu.compat import pipeline_tasks
from optimum_ipu.compat.pipelines import SUPPORTED_TASKS

INFERENCE_CONFIG = dict(layers_per_ipu=[2, 2], ipus_per_replica=2)
TEXTS = ["alice was born in paris .", "bob lives in rome", "where is the river seine ?"]
MASKED = ["alice was born in [MASK] .", "bob lives in [MASK]"]
MODEL_CLASSES = {name: spec["class"] for name, spec in SUPPORTED_TASKS.items()}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def saved(directory, cls, **config):
    """A tiny BERT model of `cls` and the tiny tokenizer, saved as a local checkpoint."""
    seeded(0)
    tiny_tokenizer(directory)
    cls(tiny_bert_config(**config)).eval().save_pretrained(directory)
    return str(directory)


def saved_config(directory, config, architecture):
    """Only a config naming `architecture`: all the inference reads."""
    config.architectures = [architecture]
    config.save_pretrained(directory)
    return str(directory)


@pytest.mark.parametrize(
    "task, cls, options",
    [
        ("text-classification", BertForSequenceClassification, {"top_k": None}),
        ("token-classification", BertForTokenClassification, {}),
        ("fill-mask", BertForMaskedLM, {}),
    ],
)
def test_a_local_model_without_a_task_answers_as_transformers_with_the_task_named(
    tmp_path, caplog, task, cls, options
):
    path = saved(tmp_path, cls, num_labels=3)
    texts = MASKED if task == "fill-mask" else TEXTS
    plain = transformers.pipeline(task, model=path, device="cpu")
    with caplog.at_level(logging.WARNING, logger="optimum_ipu.compat.pipeline_tasks"):
        ipu = pipelines.pipeline(model=path, ipu_config=INFERENCE_CONFIG, fp16=False)
    assert ipu.task == task
    said = [r.getMessage() for r in caplog.records if r.name == "optimum_ipu.compat.pipeline_tasks"]
    assert len(said) == 1 and repr(task) in said[0] and cls.__name__ in said[0], said
    expected, got = plain(texts, **options), ipu(texts, **options)
    assert_same_answers(got, expected)
    ipu.model.detachFromDevice()  # the notebook frees the IPUs of each pipeline


@pytest.mark.parametrize(
    "config, architecture, task",
    [
        (GPT2Config(n_layer=1, n_embd=8, n_head=2), "GPT2LMHeadModel", "text-generation"),
        (tiny_t5_config(), "T5ForConditionalGeneration", "text2text-generation"),
        (transformers.BartConfig(), "BartForConditionalGeneration", "text2text-generation"),
        (tiny_whisper_config(), "WhisperForConditionalGeneration", "automatic-speech-recognition"),
        (transformers.Wav2Vec2Config(), "Wav2Vec2ForCTC", "automatic-speech-recognition"),
        (transformers.HubertConfig(), "HubertForSequenceClassification", "audio-classification"),
        (tiny_vit_config(), "ViTForImageClassification", "image-classification"),
        (tiny_bert_config(), "BertForQuestionAnswering", "question-answering"),
        (tiny_bert_config(), "BertForSequenceClassification", "text-classification"),
    ],
)
def test_each_task_is_read_from_transformers_tables(tmp_path, config, architecture, task):
    assert pipeline_tasks.infer_task(saved_config(tmp_path, config, architecture), MODEL_CLASSES) == task


def test_a_model_object_gives_its_task_by_its_class():
    seeded(0)
    model = ViTForImageClassification(tiny_vit_config()).eval()

    class Mine(BertForSequenceClassification):  # a user's subclass: found by its transformers base
        pass

    assert pipeline_tasks.infer_task(model, MODEL_CLASSES) == "image-classification"
    assert pipeline_tasks.infer_task(Mine(tiny_bert_config()), MODEL_CLASSES) == "text-classification"


def test_the_hubs_answer_comes_first_when_there_is_one(tmp_path, monkeypatch):
    asked = []

    def hub(model, token=None):
        asked.append(model)
        return "zero-shot-classification"

    monkeypatch.setattr(transformers.pipelines, "get_task", hub)
    assert pipeline_tasks.infer_task("someone/nli-model", MODEL_CLASSES) == "zero-shot-classification"
    # A local directory is no Hub id: not asked, its architecture answers.
    path = saved_config(tmp_path, tiny_bert_config(), "BertForSequenceClassification")
    assert pipeline_tasks.infer_task(path, MODEL_CLASSES) == "text-classification"
    assert asked == ["someone/nli-model"]


def test_no_task_for_the_architecture_says_so_and_to_pass_the_task(tmp_path):
    seeded(0)
    base = saved_config(tmp_path / "base", BertConfig(), "BertModel")
    with pytest.raises(ValueError, match=r"BertModel is a 'feature-extraction' model.*Pass the task"):
        pipelines.pipeline(model=base)
    unnamed = tmp_path / "unnamed"
    BertConfig().save_pretrained(unnamed)
    with pytest.raises(
        ValueError, match=r"names no architecture.*Pass the task: pipeline\(task, model=...\)"
    ):
        pipelines.pipeline(model=str(unnamed))
    with pytest.raises(ValueError, match="the BertModel passed.*'feature-extraction'.*Pass the task"):
        pipelines.pipeline(model=BertModel(tiny_bert_config()))
    with pytest.raises(ValueError, match="could not be read.*Pass the task"):
        pipelines.pipeline(model=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="Pass a task, a model, or both"):
        pipelines.pipeline()


def test_an_unknown_hub_id_offline_says_why():
    with pytest.raises(ValueError, match="(?s)offline mode.*could not be read.*Pass the task"):
        pipelines.pipeline(model="nobody/no-such-model")
