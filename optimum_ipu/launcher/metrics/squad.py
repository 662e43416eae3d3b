"""`squad` and `squad_v2`, as `evaluate.load(...)` returns them (the official SQuAD 1.1 / 2.0 scoring).

Answers are normalised before comparison (lower-cased, punctuation dropped, the articles a/an/the
dropped, whitespace collapsed). Exact match: the normalised strings are equal. F1: token overlap
(counted with multiplicity) between prediction and reference. A question scores its best reference;
the set scores the mean, x 100.

The two versions differ where a side is empty after normalisation: 1.1's F1 is then 0 (even for two
empty answers) and a question without references cannot be scored; 2.0 treats "no reference" as the
empty answer, scores F1 1 when both are empty, drops references that normalise to nothing, and
reports answerable (`HasAns_*`) and unanswerable (`NoAns_*`) questions apart plus the best scores
over all no-answer thresholds (`best_exact`, `best_f1` and their `_thresh`).
"""

from __future__ import annotations

import re
import string
import sys
from collections import Counter

import datasets
import evaluate

from optimum_ipu.launcher.metrics._info import metric_info

__all__ = ["Squad", "SquadV2", "normalize_answer"]

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)
_ANSWERS = datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")})


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _overlap_f1(predicted: list[str], expected: list[str]) -> float:
    same = sum((Counter(predicted) & Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def _texts(answers) -> list[str]:
    """Reference texts from `{"text": [...], ...}` (the decoded feature) or a list of `{"text": ...}`."""
    if isinstance(answers, dict):
        return list(answers["text"])
    return [answer["text"] for answer in answers]


class Squad(evaluate.Metric):
    """`squad`: SQuAD 1.1 exact match and F1 (0 to 100)."""

    def _info(self):
        features = datasets.Features({
            "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")},
            "references": {"id": datasets.Value("string"), "answers": _ANSWERS},
        })  # fmt: skip
        return metric_info(self, features, "predictions [{'id', 'prediction_text'}], references [{'id', 'answers'}]",
                           "{'exact_match': float, 'f1': float}")  # fmt: skip

    def _compute(self, predictions, references):
        predicted = {p["id"]: p["prediction_text"] for p in predictions}
        exact = f1 = 0.0
        for reference in references:
            if reference["id"] not in predicted:  # counts in the total with a score of 0, as in SQuAD 1.1
                print(f"Unanswered question {reference['id']} will receive score 0.", file=sys.stderr)
                continue
            prediction = normalize_answer(predicted[reference["id"]])
            truths = [normalize_answer(text) for text in _texts(reference["answers"])]
            exact += max(float(prediction == truth) for truth in truths)
            f1 += max(_overlap_f1(prediction.split(), truth.split()) for truth in truths)
        total = len(references)
        return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def _v2_f1(truth: str, prediction: str) -> float:
    truth_tokens, predicted_tokens = truth.split(), prediction.split()
    if not truth_tokens or not predicted_tokens:
        return float(truth_tokens == predicted_tokens)
    return _overlap_f1(predicted_tokens, truth_tokens)


def _best_threshold(predictions, scores, no_answer_probability, has_answer):
    """The best score over all no-answer thresholds, and that threshold (SQuAD 2.0's `find_best_thresh`)."""
    current = best = sum(1 for qid in has_answer if not has_answer[qid])
    threshold = 0.0
    for qid in sorted(no_answer_probability, key=lambda q: no_answer_probability[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, threshold = current, no_answer_probability[qid]
    return 100.0 * best / len(scores), threshold


class SquadV2(evaluate.Metric):
    """`squad_v2`: SQuAD 2.0 exact match and F1 (0 to 100) with unanswerable questions."""

    def _info(self):
        features = datasets.Features({
            "predictions": {
                "id": datasets.Value("string"),
                "prediction_text": datasets.Value("string"),
                "no_answer_probability": datasets.Value("float32"),
            },
            "references": {"id": datasets.Value("string"), "answers": _ANSWERS},
        })  # fmt: skip
        return metric_info(
            self, features,
            "predictions [{'id', 'prediction_text', 'no_answer_probability'}], references [{'id', 'answers'}]; "
            "no_answer_threshold=1.0",
            "{'exact', 'f1', 'total', 'HasAns_exact', 'HasAns_f1', 'HasAns_total', 'NoAns_exact', 'NoAns_f1', "
            "'NoAns_total', 'best_exact', 'best_exact_thresh', 'best_f1', 'best_f1_thresh'}",
        )  # fmt: skip

    def _compute(self, predictions, references, no_answer_threshold=1.0):
        no_answer_probability = {p["id"]: p["no_answer_probability"] for p in predictions}
        predicted = {p["id"]: p["prediction_text"] for p in predictions}
        has_answer = {r["id"]: bool(_texts(r["answers"])) for r in references}
        exact_raw, f1_raw = {}, {}
        for reference in references:
            qid = reference["id"]
            truths = [normalize_answer(t) for t in _texts(reference["answers"]) if normalize_answer(t)] or [
                ""
            ]
            if qid not in predicted:
                print(f"Missing prediction for {qid}")
                continue
            prediction = normalize_answer(predicted[qid])
            exact_raw[qid] = max(int(truth == prediction) for truth in truths)
            f1_raw[qid] = max(_v2_f1(truth, prediction) for truth in truths)

        def thresholded(raw: dict) -> dict:
            return {
                qid: float(not has_answer[qid]) if no_answer_probability[qid] > no_answer_threshold else score
                for qid, score in raw.items()
            }

        exact, f1 = thresholded(exact_raw), thresholded(f1_raw)

        def summary(qids) -> dict:
            return {
                "exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
                "f1": 100.0 * sum(f1[q] for q in qids) / len(qids),
                "total": len(qids),
            }

        result = summary(list(exact))
        for prefix, wanted in (("HasAns", True), ("NoAns", False)):
            qids = [q for q, answerable in has_answer.items() if answerable == wanted]
            if qids:
                result.update({f"{prefix}_{key}": value for key, value in summary(qids).items()})
        result["best_exact"], result["best_exact_thresh"] = _best_threshold(
            predicted, exact_raw, no_answer_probability, has_answer
        )
        result["best_f1"], result["best_f1_thresh"] = _best_threshold(
            predicted, f1_raw, no_answer_probability, has_answer
        )
        return result
