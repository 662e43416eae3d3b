"""QA features and post-processing (examples/question-answering: qa_features.py, utils_qa.py).

Hand-built features with known offsets check each rule of span selection; a round trip through the
real tokenisation (tiny tokenizer, several windows per example) checks that the answer token
positions computed for training are read back as the original answer text.
"""

import json
from functools import partial

import numpy as np
import pytest
from fixtures import QA_EXAMPLE_DIR, tiny_tokenizer, use_example, write_synthetic_squad

use_example(QA_EXAMPLE_DIR)
from qa_data import load_qa_file  # noqa: E402
from qa_features import (  # noqa: E402
    FeatureSettings,
    answer_token_span,
    check_tokenizer,
    prepare_train_features,
    prepare_validation_features,
)
from squad_metric import compute  # noqa: E402
from utils_qa import postprocess_qa_predictions  # noqa: E402

CONTEXT = "Alice lives in Paris now"
# Token layout of one feature: [CLS] where does alice live [SEP] alice lives in paris now [SEP] [PAD]
OFFSETS = [None, None, None, None, None, None, (0, 5), (6, 11), (12, 14), (15, 20), (21, 24), None, None]
ALICE, LIVES, IN, PARIS, NOW = 6, 7, 8, 9, 10
SEQ = len(OFFSETS)


def logits(**peaks):
    """Start/end logits of -5 everywhere except the given {index: value} peaks."""
    values = np.full(SEQ, -5.0)
    for index, value in peaks.items():
        values[int(index.lstrip("t"))] = value
    return values


def run(start, end, examples=None, features=None, **kwargs):
    examples = examples or [{"id": "q1", "context": CONTEXT}]
    features = features or [{"example_id": "q1", "offset_mapping": OFFSETS}]
    return postprocess_qa_predictions(examples, features, (np.stack(start), np.stack(end)), **kwargs)


def test_best_span_is_the_highest_start_plus_end_logit_inside_the_context():
    result = run([logits(t9=3, t6=1)], [logits(t9=3, t10=2)])
    assert result.predictions == {"q1": "Paris"}
    best = result.nbest["q1"][0]
    assert (best["start"], best["end"], best["score"]) == (15, 20, 6.0)
    assert sum(c["probability"] for c in result.nbest["q1"]) == pytest.approx(1.0)


def test_spans_that_touch_non_context_tokens_are_dropped():
    # The highest start logit is on a question token (index 3), which has no offsets.
    result = run([logits(t3=9, t8=1)], [logits(t3=9, t9=1)])
    assert result.predictions["q1"] == "in Paris"


def test_spans_ending_before_they_start_or_too_long_are_dropped():
    reversed_span = run([logits(t10=5, t7=1)], [logits(t6=5, t7=1)])
    assert reversed_span.predictions["q1"] == "lives"
    # alice..now (5 tokens) and in..now (3) are too long for max_answer_length=2: in..paris wins.
    too_long = run([logits(t6=5, t8=2)], [logits(t10=5, t9=2)], max_answer_length=2)
    assert too_long.predictions["q1"] == "in Paris"
    texts = {c["text"] for c in too_long.nbest["q1"]}
    assert not texts & {"Alice lives in Paris now", "in Paris now", "lives in Paris"}


def test_the_answer_can_come_from_any_feature_of_an_example():
    features = [
        {"example_id": "q1", "offset_mapping": OFFSETS},
        {"example_id": "q1", "offset_mapping": OFFSETS},
    ]
    result = run([logits(t6=1), logits(t9=4)], [logits(t6=1), logits(t9=4)], features=features)
    assert result.predictions["q1"] == "Paris"


def test_v2_null_answer_wins_when_its_score_beats_the_best_span_by_more_than_the_threshold():
    start, end = [logits(t0=2.5, t9=2)], [logits(t0=2.5, t9=2)]  # null 5.0, best span 4.0
    answered_null = run(start, end, version_2_with_negative=True)
    assert answered_null.predictions["q1"] == ""
    assert answered_null.null_odds["q1"] == pytest.approx(1.0)
    assert answered_null.no_answer_probability["q1"] > 0.5
    lenient = run(start, end, version_2_with_negative=True, null_score_diff_threshold=2.0)
    assert lenient.predictions["q1"] == "Paris"


def test_v2_null_score_is_the_smallest_over_the_features():
    # Window 1 says "not here" strongly (null 10); window 2 finds the answer (null -2 < span 8).
    features = [
        {"example_id": "q1", "offset_mapping": OFFSETS},
        {"example_id": "q1", "offset_mapping": OFFSETS},
    ]
    result = run(
        [logits(t0=5), logits(t0=-1, t9=4)],
        [logits(t0=5), logits(t0=-1, t9=4)],
        features=features,
        version_2_with_negative=True,
    )
    assert result.predictions["q1"] == "Paris"
    assert result.null_odds["q1"] == pytest.approx(-2 - 8)


def test_prediction_files_are_written_with_the_prefix(tmp_path):
    run([logits(t9=3)], [logits(t9=3)], version_2_with_negative=True, output_dir=str(tmp_path), prefix="eval")
    assert json.loads((tmp_path / "eval_predictions.json").read_text()) == {"q1": "Paris"}
    nbest = json.loads((tmp_path / "eval_nbest_predictions.json").read_text())
    assert nbest["q1"][0]["text"] == "Paris" and "probability" in nbest["q1"][0]
    assert "q1" in json.loads((tmp_path / "eval_null_odds.json").read_text())


def test_misaligned_predictions_are_rejected():
    with pytest.raises(ValueError, match="2 predictions for 1 features"):
        run([logits(), logits()], [logits(), logits()])


def test_answer_token_span_is_none_when_the_answer_is_outside_the_window():
    sequence_ids = [None, 0, 0, None, 1, 1, 1, None]
    offsets = [(0, 0), (0, 5), (6, 9), (0, 0), (10, 14), (15, 20), (21, 24), (0, 0)]
    assert answer_token_span(offsets, sequence_ids, 1, 15, 20) == (5, 5)
    assert answer_token_span(offsets, sequence_ids, 1, 11, 20) == (4, 5)  # partial first token
    assert answer_token_span(offsets, sequence_ids, 1, 2, 8) is None  # before the window


@pytest.fixture(scope="module")
def tokenised(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa")
    tokenizer = tiny_tokenizer(root / "tok")
    paths = write_synthetic_squad(
        root / "data", train_questions=40, validation_questions=30, unanswerable_fraction=0.25
    )
    examples = load_qa_file(paths["validation"])
    settings = FeatureSettings(max_seq_length=32, doc_stride=12)  # forces several windows per context
    check_tokenizer(tokenizer, settings)
    train = examples.map(
        partial(prepare_train_features, tokenizer=tokenizer, settings=settings),
        batched=True,
        remove_columns=examples.column_names,
    )
    valid = examples.map(
        partial(prepare_validation_features, tokenizer=tokenizer, settings=settings),
        batched=True,
        remove_columns=examples.column_names,
    )
    return examples, train, valid


def test_features_round_trip_to_the_answers(tokenised):
    examples, train, valid = tokenised
    assert len(train) == len(valid) > len(examples)  # long contexts became several windows
    assert all(len(ids) == 32 for ids in train["input_ids"])  # padded to static shapes
    start = np.full((len(train), 32), -10.0)
    end = np.full((len(train), 32), -10.0)
    for row, (s, e) in enumerate(zip(train["start_positions"], train["end_positions"])):
        start[row, s] += 20
        end[row, e] += 20
    result = postprocess_qa_predictions(examples, valid, (start, end), version_2_with_negative=True)
    predictions = [
        {"id": k, "prediction_text": v, "no_answer_probability": result.no_answer_probability[k]}
        for k, v in result.predictions.items()
    ]
    references = [{"id": i, "answers": a} for i, a in zip(examples["id"], examples["answers"])]
    scores = compute(predictions, references, version_2_with_negative=True)
    assert scores["exact"] == 100.0 and scores["NoAns_total"] > 0


def test_check_tokenizer_explains_bad_strides(tmp_path):
    with pytest.raises(ValueError, match="doc_stride .* must be smaller than max_seq_length"):
        check_tokenizer(tiny_tokenizer(tmp_path), FeatureSettings(max_seq_length=64, doc_stride=64))
