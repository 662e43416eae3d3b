"""SQuAD exact match / F1 (examples/question-answering/squad_metric.py) against hand-computed cases."""

import math

import pytest
from fixtures import QA_EXAMPLE_DIR, use_example

use_example(QA_EXAMPLE_DIR)
from squad_metric import (  # noqa: E402
    compute,
    compute_squad,
    compute_squad_v2,
    exact_match_score,
    f1_score,
    normalize_answer,
)


def ref(qid, *texts):
    return {"id": qid, "answers": {"text": list(texts), "answer_start": [0] * len(texts)}}


def pred(qid, text, no_answer_probability=None):
    row = {"id": qid, "prediction_text": text}
    if no_answer_probability is not None:
        row["no_answer_probability"] = no_answer_probability
    return row


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an   apple, a pear ", "apple pear"),
        ("Theatre", "theatre"),  # "the" only as a whole word
        ("A.D. 1066", "ad 1066"),
        ("", ""),
    ],
)
def test_normalisation_lowercases_and_drops_punctuation_articles_and_extra_spaces(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_ignores_case_articles_and_punctuation():
    assert exact_match_score("the Seine.", "Seine") == 1.0
    assert exact_match_score("Seine river", "Seine") == 0.0


def test_f1_is_token_overlap_harmonic_mean():
    # prediction {cat, sat}, reference {cat, sat, on, mat}: precision 1, recall 1/2 -> F1 2/3
    assert f1_score("the cat sat", "cat sat on the mat") == pytest.approx(2 / 3)
    # tokens count with multiplicity: "x x y" vs "x y y" -> overlap 2, P = R = 2/3
    assert f1_score("x x y", "x y y") == pytest.approx(2 / 3)
    assert f1_score("paris", "rome") == 0.0
    assert f1_score("", "") == 1.0 and f1_score("paris", "") == 0.0


def test_v1_scores_are_means_over_questions_on_a_0_to_100_scale():
    scores = compute_squad(
        [pred("q1", "Paris"), pred("q2", "the cat sat")],
        [ref("q1", "Paris"), ref("q2", "cat sat on the mat")],
    )
    assert scores["exact_match"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)


def test_v1_takes_the_best_reference_answer():
    scores = compute_squad([pred("q1", "in 1984")], [ref("q1", "1984", "in the year 1984")])
    # vs "1984": P = 1/2, R = 1 -> 2/3; vs "in the year 1984" (tokens in, year, 1984): P = 1, R = 2/3 -> 0.8
    assert scores["exact_match"] == 0.0
    assert scores["f1"] == pytest.approx(80.0)


def test_missing_predictions_are_an_error_naming_the_questions():
    with pytest.raises(ValueError, match="no prediction.*q2"):
        compute_squad([pred("q1", "Paris")], [ref("q1", "Paris"), ref("q2", "Rome")])


def test_v2_splits_answerable_and_unanswerable_questions():
    references = [ref("q1", "Paris"), ref("q2")]  # q2 has no answer
    right = compute_squad_v2([pred("q1", "Paris", 0.1), pred("q2", "", 0.9)], references)
    assert right["exact"] == right["exact_match"] == 100.0
    assert right["HasAns_total"] == 1 and right["NoAns_total"] == 1 and right["total"] == 2

    wrong = compute_squad_v2([pred("q1", "Paris", 0.1), pred("q2", "Rome", 0.9)], references)
    assert wrong["exact"] == 50.0 and wrong["HasAns_exact"] == 100.0 and wrong["NoAns_exact"] == 0.0
    assert wrong["NoAns_f1"] == 0.0


def test_v2_best_threshold_abstains_where_the_no_answer_probability_is_high():
    # Abstaining above 0.1 answers q1 (right) and abstains on q2 (right): 100 %, threshold 0.1.
    scores = compute_squad_v2(
        [pred("q1", "Paris", 0.1), pred("q2", "Rome", 0.9)], [ref("q1", "Paris"), ref("q2")]
    )
    assert scores["best_exact"] == 100.0
    assert scores["best_exact_thresh"] == pytest.approx(0.1)
    # Only answerable questions, all right: the best is to abstain nowhere.
    assert compute_squad_v2([pred("q1", "Paris", 0.3)], [ref("q1", "Paris")])["best_f1"] == 100.0


def test_compute_dispatches_on_version():
    v1 = compute([pred("q1", "Paris")], [ref("q1", "Paris")])
    v2 = compute([pred("q1", "")], [ref("q1")], version_2_with_negative=True)
    assert set(v1) == {"exact_match", "f1"}
    assert v2["NoAns_exact"] == 100.0 and not math.isnan(v2["best_f1"])
