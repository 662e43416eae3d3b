"""The task of a `pipeline(model=...)` called without `task=`: the Hub's answer, else the model's architecture.

Optimum Graphcore, like transformers, asked the Hub for the model's `pipeline_tag`. That cannot answer
offline (`HF_HUB_OFFLINE=1`), for a local directory, or for a model the Hub has no tag for; there the
task is read from the model itself: its config's `architectures` (or, for a model passed as an object,
its class) looked up in transformers' own auto-model tables (`MODEL_FOR_*_MAPPING_NAMES`, through the
auto classes each task loads its model with). The Hub derives a model's default tag from the same
architecture, so both give the same task for an ordinary checkpoint. The inferred task, and what it was
inferred from, is logged once per pipeline.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

import transformers.pipelines
from transformers import AutoConfig

logger = logging.getLogger(__name__)

# The tasks an architecture can name, in the order they are tried. A task that runs the same model class
# as a more general one is never inferred, as the Hub never tags a model with it by default:
# zero-shot-classification runs a sequence classifier (-> text-classification), summarization and
# translation run a seq2seq LM (-> text2text-generation). Where transformers' tables list one class for
# two tasks, the first here wins: speech recognition (Whisper's and other speech models'
# ForConditionalGeneration are speech seq2seq models too), and text2text-generation before fill-mask
# (BART's ForConditionalGeneration fills masks too, but is a seq2seq generator first).
INFERABLE_TASKS = (
    "automatic-speech-recognition",
    "audio-classification",
    "image-classification",
    "question-answering",
    "text-classification",
    "token-classification",
    "text2text-generation",
    "fill-mask",
    "text-generation",
)


def infer_task(
    model: Any,
    model_classes: Mapping[str, tuple],
    revision: str | None = None,
    token: str | bool | None = None,
) -> str:
    """The task to build a pipeline for when none was given.

    Args:
        model: a model name or path, or a loaded transformers model.
        model_classes: for each task run here, the auto classes that load its model
            (e.g. `{"fill-mask": (AutoModelForMaskedLM,)}`).
        revision, token: for reading the model's config from the Hub or its cache.

    Raises:
        ValueError: when neither the Hub nor the model's architecture names a task run here; the
            message says what was found and to pass `task=`.
    """
    if isinstance(model, str):
        task, hub_failure = _ask_hub(model, token)
        if task is not None:
            return task
        try:
            config = AutoConfig.from_pretrained(model, revision=revision, token=token)
        except (OSError, ValueError) as error:
            raise ValueError(
                f"Cannot tell the task of {model!r}: {hub_failure}, and "
                f"the model's config could not be read ({error}). {_pass_the_task(model_classes)}"
            ) from error
        names = list(config.architectures or [])
        source = "its config"
        where = hub_failure
    else:
        # A subclass of a transformers model is looked up by its transformers base.
        names = [cls.__name__ for cls in type(model).__mro__]
        source = f"its class {type(model).__name__}"
        where = "a model passed as an object has no Hub id"
    for name in names:
        for task in INFERABLE_TASKS:
            if task in model_classes and name in _architectures(model_classes[task]):
                logger.warning(
                    "No task given: running %r, the task of the model's architecture %s (read from %s; %s). "
                    "Pass task= to choose another.", task, name, source, where,
                )  # fmt: skip
                return task
    raise ValueError(
        f"Cannot tell the task of {_describe(model)} from {source}: {_why_none(names)} "
        f"{_pass_the_task(model_classes)}"
    )


def _ask_hub(model: str, token: str | bool | None) -> tuple[str | None, str]:
    """transformers' own answer (the Hub's pipeline tag), or None and why there is none."""
    if os.path.isdir(model):
        return None, "the Hub was not asked: a local directory has no Hub page"
    try:
        return transformers.pipelines.get_task(model, token=token), ""
    except RuntimeError as error:  # offline, no such model, no tag: transformers says which
        return None, f"the Hub could not answer: {error}"


def _architectures(auto_classes: Iterable[type]) -> set[str]:
    """The model class names transformers' tables list for these auto classes (e.g. for
    AutoModelForMaskedLM: BertForMaskedLM, RobertaForMaskedLM, ...)."""
    names: set[str] = set()
    for auto_class in auto_classes:
        # The auto class's `MODEL_FOR_*_MAPPING_NAMES` (model type -> class name or names); the tests
        # check that every task is found through it, so a change in transformers shows there.
        table = getattr(getattr(auto_class, "_model_mapping", None), "_model_mapping", {})
        for value in table.values():
            names.update((value,) if isinstance(value, str) else value)
    return names


def _why_none(names: list[str]) -> str:
    """What the architectures are for, in transformers' task list, when no task here runs them."""
    if not names:
        return "it names no architecture."
    for name in names:
        for task, spec in transformers.pipelines.SUPPORTED_TASKS.items():
            if name in _architectures(spec.get("pt", ())):
                return f"{name} is a {task!r} model, a task with no pipeline on the simulated IPU."
    return f"no task run here takes {names[0]}."


def _pass_the_task(model_classes: Mapping[str, tuple]) -> str:
    return f"Pass the task: pipeline(task, model=...), task one of {sorted(model_classes)} (or an alias)."


def _describe(model: Any) -> str:
    return repr(model) if isinstance(model, str) else f"the {type(model).__name__} passed"
