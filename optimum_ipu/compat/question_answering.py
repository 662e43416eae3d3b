"""`IPUQuestionAnsweringPipeline`: extractive question answering with the model on the simulated IPU.

transformers v5 dropped its extractive question-answering pipeline, but Optimum Graphcore users call
`pipeline("question-answering", model=..., ipu_config=...)` with `question=` and `context=` and get
`{"score", "start", "end", "answer"}`. This is that pipeline, written for the IPU: a question and its
context are tokenized into features (a long context is cut into overlapping windows, `doc_stride`
tokens apart), all features of one question are one host call, and the answer is the best span over
all windows: start and end inside the context, end not before start, at most `max_answer_len`
tokens, scored by the product of the start and end probabilities (a softmax over each window's
context tokens, plus the [CLS] token when `handle_impossible_answer=True`, whose score is then the
"no answer" score).
"""

from __future__ import annotations

import inspect

import numpy as np
from transformers import Pipeline

__all__ = ["IPUQuestionAnsweringPipeline", "RunsOnIPU"]


class RunsOnIPU:
    """Mixin for pipelines whose forward is one host call of `self.ipu` (an `IPUInference`)."""

    ipu = None

    def attach_ipu(self, ipu) -> None:
        """Run the forward on `ipu`; inputs go to the device of the first IPU's blocks."""
        self.ipu = ipu
        self.device = ipu.input_device

    @property
    def ipu_config(self):
        """The pipeline's IPU config (a copy of the one given, in inference mode)."""
        return None if self.ipu is None else self.ipu.ipu_config

    def __call__(self, *args, **kwargs):
        """The pipeline's own call. Nothing changes the weights between its inputs, so with emulated fp16
        every input's host call reads fp32 copies of them made once for the call (`IPUInference.holding`).
        A dataset or generator input returns an iterator that runs after this returns: there each host
        call makes its own copies."""
        if self.ipu is None:
            return super().__call__(*args, **kwargs)
        with self.ipu.holding():
            return super().__call__(*args, **kwargs)


def _softmax(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    masked = np.where(allowed, logits, -np.inf)
    exp = np.exp(masked - masked.max())
    return exp / exp.sum()


class IPUQuestionAnsweringPipeline(RunsOnIPU, Pipeline):
    """Extractive question answering on the simulated IPU.

    Call it with `question=` and `context=` (strings, or lists of equal length), a dict with those
    keys, or a list of such dicts. Options (at construction or per call): `top_k` (answers per
    question, default 1), `max_answer_len` (tokens, default 15), `max_seq_len` (tokens per window,
    default min(384, the tokenizer's maximum)), `doc_stride` (overlap of windows, default 128, at most
    half a window), `handle_impossible_answer` (allow the empty answer, default False).
    """

    def _sanitize_parameters(
        self,
        top_k=None,
        max_answer_len=None,
        max_seq_len=None,
        doc_stride=None,
        handle_impossible_answer=None,
    ):
        preprocess = {
            k: v for k, v in (("max_seq_len", max_seq_len), ("doc_stride", doc_stride)) if v is not None
        }
        postprocess = {
            k: v
            for k, v in (("top_k", top_k), ("max_answer_len", max_answer_len),
                         ("handle_impossible_answer", handle_impossible_answer))
            if v is not None
        }  # fmt: skip
        if postprocess.get("top_k", 1) < 1 or postprocess.get("max_answer_len", 1) < 1:
            raise ValueError(f"top_k and max_answer_len must be >= 1, got {postprocess}.")
        return preprocess, {}, postprocess

    def __call__(self, *args, question=None, context=None, **kwargs):
        """Answer one question (returns a dict, or a list of `top_k` dicts) or several (a list of those)."""
        if kwargs.get("batch_size", self._batch_size) not in (None, 1):
            raise ValueError(
                "batch_size > 1 is not supported for question answering: the windows of one question already "
                "form one batch on the IPU. Leave batch_size unset."
            )
        if args:
            if len(args) != 1 or question is not None or context is not None:
                raise TypeError(
                    "Pass either one positional input (a dict or a list of dicts) or question= and context=."
                )
            inputs = args[0]
        elif question is not None and context is not None:
            if isinstance(question, str) != isinstance(context, str):
                raise TypeError("question= and context= must both be strings or both be lists.")
            if isinstance(question, str):
                inputs = {"question": question, "context": context}
            else:
                if len(question) != len(context):
                    raise ValueError(f"{len(question)} questions but {len(context)} contexts.")
                inputs = [{"question": q, "context": c} for q, c in zip(question, context)]
        else:
            raise TypeError("Pass question= and context=, or a dict {'question': ..., 'context': ...}.")
        for item in [inputs] if isinstance(inputs, dict) else inputs:
            if not isinstance(item, dict) or not {"question", "context"} <= set(item):
                raise TypeError(f"Each input needs 'question' and 'context' keys, got {item!r}.")
        return super().__call__(inputs, **kwargs)

    def preprocess(self, example: dict[str, str], max_seq_len: int | None = None, doc_stride: int = 128):
        limit = min(384, self.tokenizer.model_max_length or 384)
        max_seq_len = max_seq_len or limit
        doc_stride = min(doc_stride, max_seq_len // 2)
        question, context = example["question"].lstrip(), example["context"]
        right_padded = self.tokenizer.padding_side == "right"
        encoded = self.tokenizer(
            question if right_padded else context,
            context if right_padded else question,
            truncation="only_second" if right_padded else "only_first",
            max_length=max_seq_len,
            stride=doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            padding=True,
            return_tensors="pt",
        )
        context_index = 1 if right_padded else 0
        in_context = [
            [sequence == context_index for sequence in encoded.sequence_ids(i)]
            for i in range(len(encoded["input_ids"]))
        ]
        accepted = inspect.signature(type(self.model).forward).parameters
        model_inputs = {k: v for k, v in encoded.items() if k in accepted}
        meta = {"offsets": encoded["offset_mapping"], "in_context": in_context, "context": context}
        return {"model_inputs": model_inputs, "meta": meta}

    def _forward(self, inputs):
        outputs = self.ipu(inputs["model_inputs"])
        return {
            "start_logits": outputs.start_logits,
            "end_logits": outputs.end_logits,
            "meta": inputs["meta"],
        }

    def postprocess(
        self, outputs, top_k: int = 1, max_answer_len: int = 15, handle_impossible_answer: bool = False
    ):
        meta = outputs["meta"]
        context, offsets = meta["context"], np.asarray(meta["offsets"])
        starts, ends = outputs["start_logits"].numpy(), outputs["end_logits"].numpy()
        candidates: dict[tuple[int, int], float] = {}
        null_score = None
        for window in range(starts.shape[0]):
            allowed = np.asarray(meta["in_context"][window])
            if handle_impossible_answer:
                allowed = allowed.copy()
                allowed[0] = True  # [CLS]: the "no answer" position
            p_start, p_end = _softmax(starts[window], allowed), _softmax(ends[window], allowed)
            if handle_impossible_answer:
                score = float(p_start[0] * p_end[0])
                null_score = score if null_score is None else min(null_score, score)
                p_start[0] = p_end[0] = 0.0
            # scores[s, e] for start s <= end e < s + max_answer_len, all inside the context
            scores = np.tril(np.triu(np.outer(p_start, p_end)), max_answer_len - 1)
            best = np.argsort(scores, axis=None)[::-1][: top_k * 4]  # a few spare: spans may coincide
            for flat in best:
                s, e = np.unravel_index(flat, scores.shape)
                if scores[s, e] <= 0:
                    break
                span = (int(offsets[window, s, 0]), int(offsets[window, e, 1]))
                candidates[span] = max(candidates.get(span, 0.0), float(scores[s, e]))
        answers = [
            {"score": score, "start": start, "end": end, "answer": context[start:end]}
            for (start, end), score in sorted(candidates.items(), key=lambda item: -item[1])
        ]
        if null_score is not None:
            answers.append({"score": null_score, "start": 0, "end": 0, "answer": ""})
            answers.sort(key=lambda answer: -answer["score"])
        answers = answers[:top_k]
        if not answers:
            answers = [{"score": 0.0, "start": 0, "end": 0, "answer": ""}]  # no context token at all
        return answers[0] if top_k == 1 else answers
