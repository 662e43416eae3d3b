"""SQuAD v1.1 and v2.0 scores (exact match and token F1, on a 0-100 scale), in plain Python.

``evaluate.load("squad")`` needs the Hub, which is unreachable where this project runs, so the
metric is implemented here from its definition:

* answers are *normalised* before comparison: lower-cased, punctuation removed, the articles
  "a", "an", "the" removed, whitespace collapsed;
* exact match is 1 when the normalised prediction equals a normalised reference answer;
* F1 is the harmonic mean of token precision and recall between the normalised prediction and a
  reference (tokens counted with multiplicity); when either side has no tokens it is 1 if both are
  empty, else 0;
* each question takes its best score over its reference answers; the set score is the mean x 100.

SQuAD v2 treats a question without reference answers as "no answer": the prediction must be the
empty string. Its report splits the scores into answerable (``HasAns_*``) and unanswerable
(``NoAns_*``) questions and adds the best scores over all thresholds on the no-answer probability.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace (SQuAD's normalisation)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, reference: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def f1_score(prediction: str, reference: str) -> float:
    """Token-overlap F1 between the normalised strings (0.0 to 1.0)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not predicted or not expected:
        return float(predicted == expected)
    overlap = sum((Counter(predicted) & Counter(expected)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(predicted), overlap / len(expected)
    return 2 * precision * recall / (precision + recall)


def best_over_references(metric, prediction: str, references: Iterable[str]) -> float:
    """The best ``metric(prediction, reference)`` over a question's reference answers.

    A question with no reference answer counts as one whose answer is the empty string.
    """
    return max(metric(prediction, reference) for reference in (list(references) or [""]))


def _index_references(references: Iterable[Mapping]) -> dict[str, list[str]]:
    return {str(r["id"]): list(r["answers"]["text"]) for r in references}


def _check_ids(predicted: Mapping[str, object], expected: Mapping[str, object]) -> None:
    missing = expected.keys() - predicted.keys()
    if missing:
        example = sorted(missing)[:3]
        raise ValueError(f"{len(missing)} reference question(s) have no prediction, e.g. {example}; "
                         "predict every question of the evaluation set (or score only the subset predicted).")


def compute_squad(predictions: Iterable[Mapping], references: Iterable[Mapping]) -> dict[str, float]:
    """SQuAD v1.1 scores.

    Args:
        predictions: ``{"id", "prediction_text"}`` per question.
        references: ``{"id", "answers": {"text": [...], "answer_start": [...]}}`` per question.

    Returns:
        ``{"exact_match": ..., "f1": ...}`` on a 0-100 scale, averaged over the references.
    """
    predicted = {str(p["id"]): p["prediction_text"] for p in predictions}
    expected = _index_references(references)
    _check_ids(predicted, expected)
    if not expected:
        raise ValueError("No reference questions to score.")
    exact = sum(best_over_references(exact_match_score, predicted[i], answers) for i, answers in expected.items())
    f1 = sum(best_over_references(f1_score, predicted[i], answers) for i, answers in expected.items())
    return {"exact_match": 100.0 * exact / len(expected), "f1": 100.0 * f1 / len(expected)}


def _best_threshold(scores: dict[str, float], no_answer_probability: dict[str, float],
                    answerable: dict[str, bool], predicted_empty: dict[str, bool]) -> tuple[float, float]:
    """Best total score over thresholds on the no-answer probability, and that threshold.

    Abstaining (predicting "") on every question whose probability is above the threshold: sweep the
    threshold down the sorted probabilities, starting from "abstain on all" (which scores exactly the
    unanswerable questions), and add each question's gain when it stops abstaining.
    """
    total = float(sum(not has for has in answerable.values()))
    best, best_threshold = total, 0.0
    for qid in sorted(scores, key=lambda q: no_answer_probability[q]):
        if answerable[qid]:
            total += scores[qid]
        elif not predicted_empty[qid]:
            total -= 1.0  # was right to abstain, now answers an unanswerable question
        if total > best:
            best, best_threshold = total, no_answer_probability[qid]
    return 100.0 * best / len(scores), best_threshold


def compute_squad_v2(predictions: Iterable[Mapping], references: Iterable[Mapping]) -> dict[str, float]:
    """SQuAD v2.0 scores, with the answerable / unanswerable breakdown.

    Args:
        predictions: ``{"id", "prediction_text", "no_answer_probability"}`` per question
            (the probability only matters for the ``best_*`` scores; default 0.0).
        references: as for `compute_squad`; an empty ``answers["text"]`` marks an unanswerable question.

    Returns:
        ``exact`` / ``exact_match`` (the same number, under SQuAD v2's and v1's names), ``f1``,
        ``total``, ``HasAns_exact``, ``HasAns_f1``, ``HasAns_total``, ``NoAns_exact``, ``NoAns_f1``,
        ``NoAns_total`` (the groups that occur), ``best_exact``, ``best_exact_thresh``, ``best_f1``,
        ``best_f1_thresh``.
    """
    predictions = list(predictions)
    predicted = {str(p["id"]): p["prediction_text"] for p in predictions}
    no_answer = {str(p["id"]): float(p.get("no_answer_probability", 0.0)) for p in predictions}
    expected = _index_references(references)
    _check_ids(predicted, expected)
    if not expected:
        raise ValueError("No reference questions to score.")

    exact, f1, answerable = {}, {}, {}
    for qid, answers in expected.items():
        gold = [a for a in answers if normalize_answer(a)] or [""]  # no usable answer = unanswerable
        answerable[qid] = gold != [""]
        exact[qid] = best_over_references(exact_match_score, predicted[qid], gold)
        f1[qid] = best_over_references(f1_score, predicted[qid], gold)

    def mean(scores: dict[str, float], ids: list[str]) -> float:
        return 100.0 * sum(scores[i] for i in ids) / len(ids)

    ids = list(expected)
    result = {"exact": mean(exact, ids), "f1": mean(f1, ids), "total": float(len(ids))}
    for group, members in (("HasAns", [i for i in ids if answerable[i]]),
                           ("NoAns", [i for i in ids if not answerable[i]])):
        if members:
            result.update({f"{group}_exact": mean(exact, members), f"{group}_f1": mean(f1, members),
                           f"{group}_total": float(len(members))})
    empty = {qid: not normalize_answer(predicted[qid]) for qid in ids}
    result["best_exact"], result["best_exact_thresh"] = _best_threshold(exact, no_answer, answerable, empty)
    result["best_f1"], result["best_f1_thresh"] = _best_threshold(f1, no_answer, answerable, empty)
    result["exact_match"] = result["exact"]
    return result


def compute(predictions: Iterable[Mapping], references: Iterable[Mapping],
            version_2_with_negative: bool = False) -> dict[str, float]:
    """SQuAD v1.1 or v2.0 scores (see `compute_squad` and `compute_squad_v2`)."""
    if version_2_with_negative:
        return compute_squad_v2(predictions, references)
    return compute_squad(predictions, references)
