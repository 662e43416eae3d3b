"""transformers' text pipelines with the model on the simulated IPU: the tasks Optimum Graphcore 0.7 ran.

Each class is transformers' own pipeline: pre- and post-processing are unchanged, so the answers are
those of `transformers.pipeline(task)` on the same model (up to fp16 rounding with `fp16=True`). Only
the model call moves: inside `_forward` the pipeline's model is a stand-in whose call is one host call
of the pipeline's `IPUInference` (sharded inference through the placed stages). Text generation runs
transformers' `generate` loop on the placed model, every step's forward with the IPU's fp16
arithmetic; the decoding loop itself runs on the host (Optimum Graphcore ran it on the device).

What the Optimum Graphcore classes added, kept here: tokenizer options (`padding`, `max_length`, ...)
passed to the pipeline or the call reach the tokenizer in fill-mask, token classification and
zero-shot classification, so `optimum.graphcore.pipeline` can pad every input to one length (static
shapes on an IPU) as it did; token classification also takes the older `grouped_entities` /
`ignore_subwords` and zero-shot classification `multi_class`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from transformers import (
    FillMaskPipeline,
    TextClassificationPipeline,
    TextGenerationPipeline,
    TokenClassificationPipeline,
    ZeroShotClassificationPipeline,
)
from transformers.pipelines.token_classification import AggregationStrategy
from transformers.tokenization_utils_base import TruncationStrategy

from optimum_ipu.compat.question_answering import RunsOnIPU
from optimum_ipu.overrides import overridden

__all__ = [
    "IPUFillMaskPipeline",
    "IPUTextClassificationPipeline",
    "IPUTextGenerationPipeline",
    "IPUTokenClassificationPipeline",
    "IPUZeroShotClassificationPipeline",
]

logger = logging.getLogger(__name__)


class _ModelOnIPU:
    """The pipeline's model as `_forward` sees it: calling it is one host call on the IPU; every other
    attribute (config, forward's signature, ...) is the model's."""

    def __init__(self, model, ipu):
        self.__dict__.update(_model=model, _ipu=ipu)

    def __call__(self, *args, **inputs):
        if args:
            raise TypeError("The IPU model of a pipeline takes keyword inputs only (input_ids=..., ...).")
        return self._ipu({name: value for name, value in inputs.items() if value is not None})

    def __getattr__(self, name: str):
        return getattr(self._model, name)


class ForwardOnIPU(RunsOnIPU):
    """Mixin: transformers' `_forward`, with the model call made on the IPU."""

    def _forward(self, *args, **kwargs):
        if self.ipu is None:
            return super()._forward(*args, **kwargs)
        with overridden(self, model=_ModelOnIPU(self.model, self.ipu)):
            return super()._forward(*args, **kwargs)


class IPUTextClassificationPipeline(ForwardOnIPU, TextClassificationPipeline):
    """transformers' text-classification (sentiment-analysis) pipeline on the simulated IPU."""


class IPUFillMaskPipeline(ForwardOnIPU, FillMaskPipeline):
    """transformers' fill-mask pipeline on the simulated IPU.

    As in Optimum Graphcore, tokenizer options can be given directly (`padding="max_length",
    max_length=128`) as well as in transformers' `tokenizer_kwargs={...}`.
    """

    def _sanitize_parameters(self, top_k=None, targets=None, tokenizer_kwargs=None, **more_tokenizer_kwargs):
        merged = {**(tokenizer_kwargs or {}), **more_tokenizer_kwargs} or None
        return super()._sanitize_parameters(top_k=top_k, targets=targets, tokenizer_kwargs=merged)


class IPUTokenClassificationPipeline(ForwardOnIPU, TokenClassificationPipeline):
    """transformers' token-classification (ner) pipeline on the simulated IPU.

    Tokenizer options (`padding`, `max_length`, ...) are passed to the tokenizer, as in Optimum
    Graphcore. `truncation` is not one of them: the pipeline always truncates, to `max_length` when
    given, else to the tokenizer's `model_max_length`. The older `grouped_entities` / `ignore_subwords`
    (which transformers v5 removed) map to `aggregation_strategy` as transformers 4 mapped them.
    """

    def _sanitize_parameters(
        self,
        ignore_labels=None,
        aggregation_strategy: AggregationStrategy | str | None = None,
        offset_mapping=None,
        is_split_into_words: bool = False,
        stride: int | None = None,
        delimiter: str | None = None,
        grouped_entities: bool | None = None,
        ignore_subwords: bool | None = None,
        **tokenizer_kwargs,
    ):
        if "truncation" in tokenizer_kwargs:
            raise ValueError(
                f"truncation={tokenizer_kwargs['truncation']!r}: token classification always truncates (to "
                "max_length when given, else to the tokenizer's model_max_length); drop the argument."
            )
        if grouped_entities is not None or ignore_subwords is not None:
            legacy = (
                AggregationStrategy.NONE
                if not grouped_entities
                else AggregationStrategy.FIRST
                if ignore_subwords
                else AggregationStrategy.SIMPLE
            )
            logger.warning(
                "grouped_entities=%s, ignore_subwords=%s are the older spelling of aggregation_strategy=%r; "
                "using that.",
                grouped_entities, ignore_subwords, legacy.value,
            )  # fmt: skip
            aggregation_strategy = aggregation_strategy or legacy
        preprocess, forward, postprocess = super()._sanitize_parameters(
            ignore_labels=ignore_labels,
            aggregation_strategy=aggregation_strategy,
            offset_mapping=offset_mapping,
            is_split_into_words=is_split_into_words,
            stride=stride,
            delimiter=delimiter,
        )
        if tokenizer_kwargs:
            preprocess["tokenizer_params"] = {**preprocess.get("tokenizer_params", {}), **tokenizer_kwargs}
        return preprocess, forward, postprocess


class IPUZeroShotClassificationPipeline(ForwardOnIPU, ZeroShotClassificationPipeline):
    """transformers' zero-shot-classification pipeline on the simulated IPU: one host call per
    (sequence, candidate label) pair. `padding`, `max_length` and `truncation` reach the tokenizer
    (transformers v5 ignores them); `multi_class` is the older name of `multi_label`."""

    _TOKENIZER_OPTIONS = ("padding", "max_length", "truncation")

    def _sanitize_parameters(self, **kwargs):
        if kwargs.get("multi_class") is not None:
            logger.warning(
                "`multi_class` is the older name of `multi_label`; using multi_label=%s.",
                kwargs["multi_class"],
            )
            kwargs["multi_label"] = kwargs.pop("multi_class")
        tokenizer_kwargs = {k: kwargs.pop(k) for k in self._TOKENIZER_OPTIONS if k in kwargs}
        preprocess, forward, postprocess = super()._sanitize_parameters(**kwargs)
        return {**preprocess, **tokenizer_kwargs}, forward, postprocess

    def preprocess(
        self, inputs, candidate_labels=None, hypothesis_template="This example is {}.", **tokenizer_kwargs
    ):
        if not tokenizer_kwargs:
            yield from super().preprocess(inputs, candidate_labels, hypothesis_template)
            return
        pairs, sequences = self._args_parser(inputs, candidate_labels, hypothesis_template)
        for i, (label, pair) in enumerate(zip(candidate_labels, pairs)):
            yield {
                "candidate_label": label,
                "sequence": sequences[0],
                "is_last": i == len(candidate_labels) - 1,
                **self._tokenize_pair(pair, **tokenizer_kwargs),
            }

    def _tokenize_pair(self, pair, padding=True, truncation=TruncationStrategy.ONLY_FIRST, max_length=None):
        """One (sequence, hypothesis) pair; only the sequence is truncated, never the hypothesis."""
        if self.tokenizer.pad_token is None:
            raise ValueError(
                "The tokenizer has no pad token, which padding needs: set tokenizer.pad_token (e.g. to "
                "tokenizer.eos_token) before building the pipeline."
            )
        options = dict(return_tensors="pt", padding=padding, max_length=max_length)
        try:
            return self.tokenizer([pair], truncation=truncation, **options)
        except ValueError as error:
            if "too short" not in str(error):  # the sequence is shorter than what truncation would remove
                raise
            return self.tokenizer([pair], truncation=TruncationStrategy.DO_NOT_TRUNCATE, **options)


class IPUTextGenerationPipeline(RunsOnIPU, TextGenerationPipeline):
    """transformers' text-generation pipeline with the placed model on the simulated IPU.

    `generate`'s loop runs on the host; each step's forward runs the placed model (its stages in turn)
    with the IPU's fp16 arithmetic. The first call compiles (checks and the per-IPU memory report) for
    the prompt's shape.
    """

    def _forward(self, model_inputs, **generate_kwargs):
        context = self.ipu.generating(model_inputs) if self.ipu is not None else contextlib.nullcontext()
        with context:
            return super()._forward(model_inputs, **generate_kwargs)


def tokenizer_defaults(task: str, max_length: int) -> dict[str, Any]:
    """The tokenizer options `optimum.graphcore.pipeline` adds for `task`: every input padded to
    `max_length` (and cut to it), so that the IPU program sees one shape, as in Optimum Graphcore."""
    options: dict[str, Any] = {"padding": "max_length", "max_length": max_length}
    if task in ("text-classification", "fill-mask"):
        options["truncation"] = True
    return options
