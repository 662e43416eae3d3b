"""Turning a QA model's start/end logits into answer texts (SQuAD post-processing).

A long context is tokenised into several overlapping *features* (windows of ``max_seq_length``
tokens, ``doc_stride`` apart), so one example's answer may be found in any of them. For each example
this module looks at every feature, takes the ``n_best_size`` highest start and end logits, keeps the
(start, end) pairs that lie inside the context and are at most ``max_answer_length`` tokens long,
scores each pair by start logit + end logit, and returns the best span's text, read from the
original context through the tokeniser's character offsets.

SQuAD v2 adds unanswerable questions: the "null answer" score is the [CLS] start + end logit
(the smallest over the example's features, i.e. the window most confident that there *is* an answer),
and the example is predicted unanswerable when ``null score - best span score >
null_score_diff_threshold``.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

logger = logging.getLogger(__name__)


@dataclass
class PostprocessedPredictions:
    """What post-processing produces, keyed by example id.

    Attributes:
        predictions: the predicted answer text ("" means "no answer" in SQuAD v2).
        nbest: the ranked candidate answers with text, character span, logits and probability.
        null_odds: SQuAD v2 only: null score minus best span score (the threshold is applied to this).
        no_answer_probability: SQuAD v2 only: the null answer's softmax probability among the n-best.
    """

    predictions: dict[str, str]
    nbest: dict[str, list[dict]]
    null_odds: dict[str, float] = field(default_factory=dict)
    no_answer_probability: dict[str, float] = field(default_factory=dict)


def _top_indices(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest values, largest first."""
    return np.argsort(logits)[::-1][:k]


def _softmax(scores: np.ndarray) -> np.ndarray:
    exp = np.exp(scores - scores.max())
    return exp / exp.sum()


def span_candidates(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    offsets: Sequence[Sequence[int] | None],
    n_best_size: int,
    max_answer_length: int,
) -> list[tuple[float, int, int, float, float]]:
    """Valid answer spans of one feature as ``(score, char_start, char_end, start_logit, end_logit)``.

    ``offsets[i]`` is the character span of token ``i`` in the context, or ``None`` for tokens that
    are not context (question, special tokens, padding); spans touching those are dropped, as are
    spans that end before they start or are longer than ``max_answer_length`` tokens.
    """
    candidates = []
    for start in _top_indices(start_logits, n_best_size):
        for end in _top_indices(end_logits, n_best_size):
            if start >= len(offsets) or end >= len(offsets):
                continue
            if offsets[start] is None or offsets[end] is None or len(offsets[start]) < 2:
                continue
            if end < start or end - start + 1 > max_answer_length:
                continue
            s_logit, e_logit = float(start_logits[start]), float(end_logits[end])
            candidates.append((s_logit + e_logit, int(offsets[start][0]), int(offsets[end][1]), s_logit, e_logit))
    return candidates


def postprocess_qa_predictions(
    examples,
    features,
    predictions: tuple[np.ndarray, np.ndarray],
    version_2_with_negative: bool = False,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    null_score_diff_threshold: float = 0.0,
    output_dir: str | None = None,
    prefix: str | None = None,
) -> PostprocessedPredictions:
    """Pick each example's answer from the logits of all its features.

    Args:
        examples: rows with ``id`` and ``context`` (a `datasets.Dataset` or a list of dicts).
        features: rows with ``example_id`` and ``offset_mapping`` (context tokens only, others
            ``None``), and optionally ``cls_index`` (default 0), aligned with ``predictions``.
        predictions: ``(start_logits, end_logits)``, each ``[num_features, seq_len]``.
        version_2_with_negative: allow the null answer (SQuAD v2).
        n_best_size: start and end candidates considered per feature, and answers kept per example.
        max_answer_length: longest answer, in tokens.
        null_score_diff_threshold: predict "no answer" when null score - best span score exceeds it.
        output_dir: if given, write ``{prefix}_predictions.json``, ``{prefix}_nbest_predictions.json``
            and (v2) ``{prefix}_null_odds.json`` there.
        prefix: file name prefix, e.g. ``"eval"``.
    """
    if len(predictions) < 2:
        raise ValueError(f"Expected (start_logits, end_logits), got {len(predictions)} array(s).")
    all_start, all_end = np.asarray(predictions[0]), np.asarray(predictions[1])
    if len(all_start) != len(features):
        raise ValueError(f"Got {len(all_start)} predictions for {len(features)} features; they must align.")

    feature_example_ids = _column(features, "example_id")
    feature_offsets = _column(features, "offset_mapping")
    feature_cls = _column(features, "cls_index") if _has_column(features, "cls_index") else [0] * len(features)
    features_of = collections.defaultdict(list)
    for index, example_id in enumerate(feature_example_ids):
        features_of[example_id].append(index)

    result = PostprocessedPredictions(predictions={}, nbest={})
    example_ids, contexts = _column(examples, "id"), _column(examples, "context")
    logger.info("Post-processing %d example predictions split into %d features.", len(example_ids), len(features))
    for example_id, context in zip(example_ids, contexts):
        candidates, null_score = [], None
        for index in features_of.get(example_id, []):
            start_logits, end_logits = all_start[index], all_end[index]
            cls = feature_cls[index]
            feature_null = float(start_logits[cls] + end_logits[cls])
            if null_score is None or feature_null < null_score:
                null_score = feature_null
                null_logits = (float(start_logits[cls]), float(end_logits[cls]))
            candidates += span_candidates(start_logits, end_logits, feature_offsets[index],
                                          n_best_size, max_answer_length)
        candidates.sort(key=lambda c: c[0], reverse=True)
        nbest = [{"text": context[s:e], "start": s, "end": e, "score": score,
                  "start_logit": sl, "end_logit": el} for score, s, e, sl, el in candidates[:n_best_size]]
        if version_2_with_negative and null_score is not None:
            nbest.append({"text": "", "start": -1, "end": -1, "score": null_score,
                          "start_logit": null_logits[0], "end_logit": null_logits[1]})
            nbest.sort(key=lambda c: c["score"], reverse=True)
            nbest = nbest[: n_best_size + 1]
        if not nbest:  # no valid span anywhere (e.g. every window was question only)
            nbest = [{"text": "", "start": -1, "end": -1, "score": 0.0, "start_logit": 0.0, "end_logit": 0.0}]
        for candidate, probability in zip(nbest, _softmax(np.array([c["score"] for c in nbest]))):
            candidate["probability"] = float(probability)

        spans = [c for c in nbest if c["start"] >= 0]
        best_span = spans[0] if spans else None
        if version_2_with_negative:
            diff = null_score - best_span["score"] if best_span and null_score is not None else float("inf")
            result.null_odds[example_id] = diff
            result.predictions[example_id] = best_span["text"] if diff <= null_score_diff_threshold else ""
            result.no_answer_probability[example_id] = sum(c["probability"] for c in nbest if c["start"] < 0)
        else:
            result.predictions[example_id] = best_span["text"] if best_span else ""
        result.nbest[example_id] = nbest

    if output_dir is not None:
        write_predictions(result, output_dir, prefix, version_2_with_negative)
    return result


def write_predictions(result: PostprocessedPredictions, output_dir: str, prefix: str | None,
                      version_2_with_negative: bool) -> list[str]:
    """Write the predictions, n-best lists and (v2) null odds as JSON; return the paths written."""
    if not os.path.isdir(output_dir):
        raise OSError(f"Output folder {output_dir!r} does not exist; create it before post-processing.")
    stem = f"{prefix}_" if prefix else ""
    files = {f"{stem}predictions.json": result.predictions, f"{stem}nbest_predictions.json": result.nbest}
    if version_2_with_negative:
        files[f"{stem}null_odds.json"] = result.null_odds
    paths = []
    for name, content in files.items():
        path = os.path.join(output_dir, name)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(content, handle, indent=2)
        paths.append(path)
    logger.info("Wrote %s.", ", ".join(paths))
    return paths


def _has_column(rows, name: str) -> bool:
    if hasattr(rows, "column_names"):
        return name in rows.column_names
    if isinstance(rows, Mapping):
        return name in rows
    return bool(rows) and name in rows[0]


def _column(rows, name: str) -> list:
    """A column as a Python list, from a `datasets.Dataset`, a dict of lists, or a list of dicts."""
    if hasattr(rows, "column_names"):
        return list(rows[name])
    if isinstance(rows, Mapping):
        return list(rows[name])
    return [row[name] for row in rows]
