"""Tokenising question/context pairs into fixed-length model features for extractive QA.

Contexts longer than ``max_seq_length`` are cut into overlapping windows ``doc_stride`` tokens apart,
each window a *feature* paired with the full question. Training features carry the answer's token
positions (``start_positions`` / ``end_positions``), or the [CLS] position when the answer is not
wholly inside the window or the question has none: the model learns "not in this window" there.
Evaluation features keep, for each token, its character span in the context (``None`` for question,
special and padding tokens) and their example's id, which is what `utils_qa` needs to map logits
back to answer text.

IPUs run on static shapes, so features are padded to ``max_seq_length`` by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class FeatureSettings:
    """How examples become features; see run_qa's DataTrainingArguments for each field's meaning."""

    max_seq_length: int = 384
    doc_stride: int = 128
    pad_to_max_length: bool = True


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, settings: FeatureSettings) -> None:
    """Fail early with the fix when the tokenizer cannot give character offsets or strides don't fit."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"{type(tokenizer).__name__} is a slow tokenizer; extractive QA needs character offsets "
            "(`return_offsets_mapping`), which only fast (tokenizers-backed) tokenizers give. Use a "
            "model whose tokenizer has a fast version (tokenizer.json)."
        )
    if settings.doc_stride >= settings.max_seq_length:
        raise ValueError(
            f"doc_stride ({settings.doc_stride}) must be smaller than max_seq_length "
            f"({settings.max_seq_length}): windows overlap by doc_stride tokens."
        )


def _tokenize(examples: dict, tokenizer: PreTrainedTokenizerBase, settings: FeatureSettings):
    # Right-padding tokenizers take the question first and truncate the context (the second text);
    # left-padding ones (e.g. XLNet) the other way round. Leading spaces in questions only waste tokens.
    question_first = tokenizer.padding_side == "right"
    questions = [q.lstrip() for q in examples["question"]]
    contexts = examples["context"]
    encoded = tokenizer(
        questions if question_first else contexts,
        contexts if question_first else questions,
        truncation="only_second" if question_first else "only_first",
        max_length=settings.max_seq_length,
        stride=settings.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length" if settings.pad_to_max_length else False,
    )
    context_sequence = 1 if question_first else 0
    return encoded, context_sequence


def _cls_index(input_ids: list[int], tokenizer: PreTrainedTokenizerBase) -> int:
    cls = tokenizer.cls_token_id
    return input_ids.index(cls) if cls is not None and cls in input_ids else 0


def answer_token_span(offsets: list[tuple[int, int]], sequence_ids: list[int | None], context_sequence: int,
                      start_char: int, end_char: int) -> tuple[int, int] | None:
    """Token indices of the first and last token covering ``[start_char, end_char)``, or ``None``.

    ``None`` when the characters are not wholly inside this feature's context window.
    """
    context_tokens = [i for i, s in enumerate(sequence_ids) if s == context_sequence]
    if not context_tokens:
        return None
    first, last = context_tokens[0], context_tokens[-1]
    if offsets[first][0] > start_char or offsets[last][1] < end_char:
        return None
    start_token = max(i for i in context_tokens if offsets[i][0] <= start_char)
    end_token = min(i for i in context_tokens if offsets[i][1] >= end_char)
    return start_token, end_token


def prepare_train_features(examples: dict, tokenizer: PreTrainedTokenizerBase, settings: FeatureSettings) -> dict:
    """Batched `datasets.map` function: examples → training features with answer token positions."""
    encoded, context_sequence = _tokenize(examples, tokenizer, settings)
    sample_of = encoded.pop("overflow_to_sample_mapping")
    offset_mapping = encoded.pop("offset_mapping")
    starts, ends = [], []
    for i, offsets in enumerate(offset_mapping):
        cls = _cls_index(encoded["input_ids"][i], tokenizer)
        answers = examples["answers"][sample_of[i]]
        span = None
        if answers["answer_start"]:  # SQuAD trains on the first reference answer
            start_char = answers["answer_start"][0]
            span = answer_token_span(offsets, encoded.sequence_ids(i), context_sequence,
                                     start_char, start_char + len(answers["text"][0]))
        starts.append(span[0] if span else cls)
        ends.append(span[1] if span else cls)
    encoded["start_positions"] = starts
    encoded["end_positions"] = ends
    return encoded


def prepare_validation_features(examples: dict, tokenizer: PreTrainedTokenizerBase,
                                settings: FeatureSettings) -> dict:
    """Batched `datasets.map` function: examples → features with ``example_id`` and context offsets."""
    encoded, context_sequence = _tokenize(examples, tokenizer, settings)
    sample_of = encoded.pop("overflow_to_sample_mapping")
    example_ids, cls_indices = [], []
    for i in range(len(encoded["input_ids"])):
        example_ids.append(examples["id"][sample_of[i]])
        cls_indices.append(_cls_index(encoded["input_ids"][i], tokenizer))
        sequence_ids = encoded.sequence_ids(i)
        encoded["offset_mapping"][i] = [
            tuple(offset) if sequence_ids[k] == context_sequence else None
            for k, offset in enumerate(encoded["offset_mapping"][i])
        ]
    encoded["example_id"] = example_ids
    encoded["cls_index"] = cls_indices
    return encoded
