"""Text-to-text pipelines (summarization, translation, text2text-generation) on the simulated IPU.

transformers v5 removed these three pipelines, but Optimum Graphcore users call
`pipeline("summarization", model=..., ipu_config=...)` and read `[{"summary_text": ...}]`. These are
those pipelines, written for the IPU: each input gets the model's prefix (T5's "summarize: ", or the
task's own from `config.task_specific_params`, e.g. "translate English to French: "), is tokenized and
padded to `max_input_length` tokens (one static shape, as in Optimum Graphcore) and truncated as
`truncation` says, then `generate()` runs on the placed model (greedy or beam search as the
generation config and the call's keywords say, every step with the IPU's fp16 arithmetic), and the
tokens are decoded without special tokens. `return_tensors=True` returns the token ids instead.

A call on one text returns a list with one dict; on a list of texts, one dict per text (a list of
dicts per text with `num_return_sequences` > 1), as transformers 4's pipelines did.
"""

from __future__ import annotations

import contextlib
from typing import Any

from transformers import Pipeline

from optimum_ipu.compat.question_answering import RunsOnIPU

__all__ = ["IPUSummarizationPipeline", "IPUText2TextGenerationPipeline", "IPUTranslationPipeline"]


class IPUText2TextGenerationPipeline(RunsOnIPU, Pipeline):
    """Text in, generated text out, with an encoder-decoder model on the simulated IPU.

    Options (at construction or per call): `max_input_length` (tokens each input is padded to),
    `truncation` (the tokenizer's, default "only_first"), `prefix` (default: the task's or the model's),
    `return_tensors` (token ids instead of text), `clean_up_tokenization_spaces`, and any `generate()`
    keyword (`max_length`, `max_new_tokens`, `num_beams`, `num_return_sequences`, ...).
    """

    return_name = "generated"

    def _sanitize_parameters(
        self,
        max_input_length: int | None = None,
        truncation: Any = None,
        prefix: str | None = None,
        return_tensors: bool | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        **generate_kwargs,
    ):
        preprocess: dict[str, Any] = {}
        if max_input_length is not None:
            preprocess["max_input_length"] = max_input_length
        if truncation is not None:
            preprocess["truncation"] = truncation
        if prefix is not None:
            preprocess["prefix"] = prefix
        postprocess: dict[str, Any] = {}
        if return_tensors is not None:
            postprocess["return_tensors"] = return_tensors
        if clean_up_tokenization_spaces is not None:
            postprocess["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess, generate_kwargs, postprocess

    def _default_prefix(self) -> str:
        params = (getattr(self.model.config, "task_specific_params", None) or {}).get(self.task or "", {})
        return params.get("prefix", getattr(self.model.config, "prefix", None) or "")

    def preprocess(
        self, text: str, max_input_length: int | None = None, truncation="only_first", prefix=None
    ):
        if not isinstance(text, str):
            raise TypeError(
                f"{type(self).__name__} takes a text or a list of texts, got {type(text).__name__}."
            )
        prefix = self._default_prefix() if prefix is None else prefix
        padding = "max_length" if max_input_length is not None else False
        inputs = self.tokenizer(prefix + text, padding=padding, max_length=max_input_length,
                                truncation=truncation if max_input_length is not None else False,
                                return_tensors="pt")  # fmt: skip
        inputs.pop("token_type_ids", None)  # a tokenizer's output that generate() does not take
        return dict(inputs)

    def _forward(self, model_inputs, **generate_kwargs):
        context = self.ipu.generating(model_inputs) if self.ipu is not None else contextlib.nullcontext()
        with context:
            return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(
        self, model_outputs, return_tensors: bool = False, clean_up_tokenization_spaces: bool = False
    ):
        records = []
        for ids in model_outputs["output_ids"]:
            if return_tensors:
                records.append({f"{self.return_name}_token_ids": ids})
            else:
                text = self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
                records.append({f"{self.return_name}_text": text})
        return records

    def __call__(self, inputs, **kwargs):
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(r) == 1 for r in result):
            return [r[0] for r in result]
        return result


class IPUSummarizationPipeline(IPUText2TextGenerationPipeline):
    """Summarization on the simulated IPU: `[{"summary_text": ...}]` per text."""

    return_name = "summary"


class IPUTranslationPipeline(IPUText2TextGenerationPipeline):
    """Translation on the simulated IPU: `[{"translation_text": ...}]` per text.

    The task may name the languages (`"translation_en_to_fr"`), which picks the model's prefix for
    them from `config.task_specific_params` (T5's "translate English to French: ").
    """

    return_name = "translation"
