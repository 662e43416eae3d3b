"""The offline metrics return what the Hub metrics of the same names return: keys, scale, options.

Expected values are worked by hand from the metrics' definitions (the scikit-learn / scipy
functions the Hub metrics call, the official SQuAD scoring, seqeval's entity scores), and the
perplexity against plain transformers' own loss.
"""

import math

import numpy as np
import pytest

pytest.importorskip("evaluate")

from optimum_ipu.launcher import LauncherError, compatibility_shims  # noqa: E402
from optimum_ipu.launcher.metrics import SERVED_METRICS, build_metric  # noqa: E402


def compute(name, config=None, **kwargs):
    return build_metric(name, config).compute(**kwargs)


def test_served_through_evaluate_load_with_the_hub_name():
    import evaluate

    with compatibility_shims():
        metric = evaluate.load("accuracy")
        same = evaluate.load("evaluate-metric/accuracy")
    assert metric.name == same.name == "accuracy"
    assert metric.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0]) == {"accuracy": 0.75}


def test_a_local_folder_is_the_users_metric_only_with_its_script_in_it(tmp_path, monkeypatch):
    """evaluate loads `path` as a local metric only where `path/NAME.py` (or the script itself) exists, and goes to
    the Hub otherwise: a data folder named `squad` beside the notebook (its `load_dataset("squad")`) does not hide
    the metric `squad`, which is served offline; a folder with its own script stays the user's."""
    import evaluate

    monkeypatch.chdir(tmp_path)
    (tmp_path / "squad").mkdir()
    (tmp_path / "squad" / "train.jsonl").write_text("{}\n")
    (tmp_path / "accuracy").mkdir()
    (tmp_path / "accuracy" / "accuracy.py").write_text("raise RuntimeError('the user script ran')\n")
    with compatibility_shims():
        squad = evaluate.load("squad")
        with pytest.raises(RuntimeError, match="the user script ran"):
            evaluate.load("accuracy")
    assert squad.compute(predictions=[{"id": "1", "prediction_text": "a b"}],
                         references=[{"id": "1", "answers": {"text": ["a b"], "answer_start": [0]}}]) == {
        "exact_match": 100.0, "f1": 100.0}  # fmt: skip


def test_accuracy():
    assert compute("accuracy", predictions=[0, 1, 1, 0], references=[0, 1, 0, 0]) == {"accuracy": 0.75}
    assert compute("accuracy", predictions=[0, 1, 1, 0], references=[0, 1, 0, 0], normalize=False) == {
        "accuracy": 3.0
    }
    weighted = compute("accuracy", predictions=[0, 1], references=[0, 0], sample_weight=[3, 1])
    assert weighted == {"accuracy": 0.75}
    # multilabel: a sample counts only when all its labels match
    assert compute("accuracy", "multilabel", predictions=[[1, 0], [1, 1]], references=[[1, 0], [1, 0]]) == {
        "accuracy": 0.5
    }


# predictions / references with TP=2, FP=1, FN=1 for class 1 and TP=1, FP=1, FN=1 for class 0
P, R = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]


def test_f1_precision_recall_binary_and_averages():
    assert compute("f1", predictions=P, references=R) == {"f1": pytest.approx(2 / 3)}
    assert compute("precision", predictions=P, references=R) == {"precision": pytest.approx(2 / 3)}
    assert compute("recall", predictions=P, references=R) == {"recall": pytest.approx(2 / 3)}
    assert compute("f1", predictions=P, references=R, pos_label=0) == {"f1": pytest.approx(0.5)}
    assert compute("f1", predictions=P, references=R, average="macro") == {
        "f1": pytest.approx((0.5 + 2 / 3) / 2)
    }
    assert compute("f1", predictions=P, references=R, average="micro") == {"f1": pytest.approx(3 / 5)}
    per_label = compute("f1", predictions=P, references=R, average=None)["f1"]
    assert isinstance(per_label, np.ndarray) and per_label.tolist() == pytest.approx([0.5, 2 / 3])
    # nothing predicted positive: zero_division decides
    assert compute("precision", predictions=[0, 0], references=[1, 0], zero_division=1) == {"precision": 1.0}


def test_matthews_correlation():
    # TP=2, TN=1, FP=0, FN=1: (2*1 - 0*1) / sqrt(2*3*1*2)
    assert compute("matthews_correlation", predictions=[1, 1, 0, 0], references=[1, 1, 0, 1]) == {
        "matthews_correlation": pytest.approx(2 / math.sqrt(12))
    }
    multilabel = build_metric("matthews_correlation", "multilabel")
    both = [[1, 0], [1, 1], [0, 0], [0, 1]]
    assert multilabel.compute(predictions=both, references=both, average="macro") == {
        "matthews_correlation": 1.0
    }


def test_mse_and_its_float32_inputs():
    assert compute("mse", predictions=[1, 2, 3], references=[1, 2, 5]) == {"mse": pytest.approx(4 / 3)}
    assert compute("mse", predictions=[1, 2, 3], references=[1, 2, 5], squared=False) == {
        "mse": pytest.approx(math.sqrt(4 / 3))
    }
    # the Hub metric declares float32 inputs: 0.1 arrives as float32(0.1)
    assert compute("mse", predictions=[0.1], references=[0.0])["mse"] == float(np.float32(0.1)) ** 2
    raw = compute(
        "mse",
        "multilist",
        predictions=[[1, 2], [3, 4]],
        references=[[1, 0], [3, 4]],
        multioutput="raw_values",
    )
    assert raw["mse"].tolist() == [0.0, 2.0]


def test_pearsonr_and_spearmanr():
    # x = [1, 2, 3], y = [2, 4, 7]: cov 5, |dx| sqrt(2), |dy| sqrt(114)/3  ->  15 / sqrt(228)
    assert compute("pearsonr", predictions=[1, 2, 3], references=[2, 4, 7]) == {
        "pearsonr": pytest.approx(15 / math.sqrt(228))
    }
    # ranks differ by d = [0, 1, -1, 0]: 1 - 6 * 2 / (4 * 15)
    assert compute("spearmanr", predictions=[1, 2, 3, 4], references=[1, 3, 2, 4]) == {
        "spearmanr": pytest.approx(0.8)
    }
    with_p = compute("spearmanr", predictions=[1, 2, 3, 4], references=[1, 3, 2, 4], return_pvalue=True)
    assert set(with_p) == {"spearmanr", "spearmanr_pvalue"}
    assert set(compute("pearsonr", predictions=[1, 2, 3], references=[2, 4, 7], return_pvalue=True)) == {
        "pearsonr",
        "p-value",
    }


def test_glue_scores_per_task():
    assert compute("glue", "cola", predictions=[1, 1, 0, 0], references=[1, 1, 0, 1]) == {
        "matthews_correlation": pytest.approx(2 / math.sqrt(12))
    }
    assert compute("glue", "mrpc", predictions=P, references=R) == {
        "accuracy": 0.6,
        "f1": pytest.approx(2 / 3),
    }
    assert compute("glue", "qqp", predictions=P, references=R) == {
        "accuracy": 0.6,
        "f1": pytest.approx(2 / 3),
    }
    for task in ("sst2", "mnli", "mnli_matched", "mnli_mismatched", "qnli", "rte", "wnli", "hans"):
        assert compute("glue", task, predictions=P, references=R) == {"accuracy": 0.6}
    assert compute("glue", "stsb", predictions=[1, 2, 3, 4], references=[1, 3, 2, 4]) == {
        "pearson": pytest.approx(0.8),
        "spearmanr": pytest.approx(0.8),
    }
    with pytest.raises(KeyError, match="cola"):
        build_metric("glue", "not-a-task")


def test_seqeval_entity_scores():
    pytest.importorskip("seqeval")
    references = [["B-PER", "I-PER", "O", "B-LOC"], ["B-LOC", "O"]]
    predictions = [["B-PER", "I-PER", "O", "O"], ["B-LOC", "B-PER"]]
    result = compute("seqeval", predictions=predictions, references=references)
    # PER: 1 of 2 predicted right, the 1 reference found; LOC: 1 predicted right, 1 of 2 references found
    assert result["PER"] == {"precision": 0.5, "recall": 1.0, "f1": pytest.approx(2 / 3), "number": 1}
    assert result["LOC"] == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "number": 2}
    assert result["overall_precision"] == pytest.approx(2 / 3) and result["overall_recall"] == pytest.approx(
        2 / 3
    )
    assert result["overall_f1"] == pytest.approx(2 / 3)
    assert result["overall_accuracy"] == pytest.approx(4 / 6)  # per tag
    assert list(result) == [
        "LOC",
        "PER",
        "overall_precision",
        "overall_recall",
        "overall_f1",
        "overall_accuracy",
    ]


def test_a_metric_whose_package_is_missing_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "seqeval" else real(name, *a)
    )
    with pytest.raises(
        LauncherError,
        match=r"metric 'seqeval' needs the seqeval package, which is not installed: pip install seqeval",
    ):
        build_metric("seqeval")


def squad_reference(qid, *texts):
    return {"id": qid, "answers": {"text": list(texts), "answer_start": [0] * len(texts)}}


def test_squad_exact_match_and_f1_on_a_0_to_100_scale():
    predictions = [
        {"id": "a", "prediction_text": "the Eiffel Tower"},
        {"id": "b", "prediction_text": "in Paris France"},
    ]
    references = [squad_reference("a", "Eiffel tower!", "a tower"), squad_reference("b", "Paris")]
    # a: equal after normalisation (EM 1, F1 1); b: tokens [in, paris, france] vs [paris]: P 1/3, R 1, F1 0.5
    assert compute("squad", predictions=predictions, references=references) == {
        "exact_match": 50.0,
        "f1": 75.0,
    }
    # SQuAD 1.1: a question without a prediction scores 0 but counts in the total
    other = [predictions[0], {"id": "z", "prediction_text": "Paris"}]
    assert compute("squad", predictions=other, references=references) == {"exact_match": 50.0, "f1": 50.0}
    # 1.1's F1 of two answers that normalise to nothing is 0 (2.0 gives 1)
    empty = compute(
        "squad", predictions=[{"id": "c", "prediction_text": "The"}], references=[squad_reference("c", "a")]
    )
    assert empty == {"exact_match": 100.0, "f1": 0.0}


def test_squad_v2_with_unanswerable_questions_and_thresholds():
    references = [squad_reference("a", "Paris"), squad_reference("b")]
    predictions = [
        {"id": "a", "prediction_text": "Paris", "no_answer_probability": 0.1},
        {"id": "b", "prediction_text": "Rome", "no_answer_probability": 0.9},
    ]
    result = compute("squad_v2", predictions=predictions, references=references)
    assert result == {
        "exact": 50.0, "f1": 50.0, "total": 2,
        "HasAns_exact": 100.0, "HasAns_f1": 100.0, "HasAns_total": 1,
        "NoAns_exact": 0.0, "NoAns_f1": 0.0, "NoAns_total": 1,
        # answering only below no-answer probability 0.9 (so not b) would have scored both
        "best_exact": 100.0, "best_exact_thresh": pytest.approx(0.1), "best_f1": 100.0, "best_f1_thresh": pytest.approx(0.1),
    }  # fmt: skip
    # above no_answer_threshold a prediction counts as "no answer": b is then right
    assert (
        compute("squad_v2", predictions=predictions, references=references, no_answer_threshold=0.5)["exact"]
        == 100.0
    )


def test_perplexity_equals_exp_of_plain_transformers_loss(tmp_path):
    import torch
    from fixtures import tiny_tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = tiny_tokenizer(tmp_path)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=32, n_embd=16, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(tmp_path)
    texts = ["alice lives in paris .", "bob works in rome as a baker"]
    result = compute(
        "perplexity", predictions=texts, model_id=str(tmp_path), add_start_token=False, batch_size=1
    )
    assert set(result) == {"perplexities", "mean_perplexity"}
    expected = []
    for text in texts:
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            expected.append(math.exp(model(ids, labels=ids).loss.item()))
    assert result["perplexities"] == pytest.approx(expected, rel=1e-5)
    assert result["mean_perplexity"] == pytest.approx(sum(expected) / 2, rel=1e-5)
    # padded batches give the same per-text values (padding is masked out)
    batched = compute(
        "perplexity", predictions=texts, model_id=str(tmp_path), add_start_token=False, batch_size=2
    )
    assert batched["perplexities"] == pytest.approx(expected, rel=1e-4)


def test_perplexity_of_a_model_not_available_offline_is_one_line():
    with pytest.raises(
        LauncherError, match=r"perplexity: could not load model_id='no-such/model-for-the-test'"
    ):
        compute("perplexity", predictions=["a text"], model_id="no-such/model-for-the-test")


def test_rouge_f_measures():
    pytest.importorskip("rouge_score")
    same = compute("rouge", predictions=["the cat sat"], references=["the cat sat"])
    assert same == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0, "rougeLsum": 1.0}
    # "the cat" vs "the cat sat": unigrams P 1, R 2/3 -> F 0.8; bigrams P 1, R 1/2 -> F 2/3
    partial = compute("rouge", predictions=["the cat"], references=["the cat sat"], use_aggregator=False)
    assert partial["rouge1"] == [pytest.approx(0.8)] and partial["rouge2"] == [pytest.approx(2 / 3)]


def test_rouge_through_load_metric_returns_datasets_2s_aggregate_scores():
    """datasets 2's `load_metric("rouge")` returned rouge-score's own results, where evaluate's returns floats:
    an `AggregateScore` (low, mid, high) per rouge type, or with `use_agregator=False` (its spelling) a list of
    `Score`s. Optimum Graphcore's summarization notebook reads `value.mid.fmeasure`."""
    pytest.importorskip("rouge_score")
    import datasets
    import evaluate

    predictions, references = ["the cat sat", "the cat"], ["the cat sat", "the cat sat"]
    with compatibility_shims():
        old = datasets.load_metric("rouge")
        assert old.name == "rouge"
        aggregated = old.compute(predictions=predictions, references=references, use_stemmer=True)
        each = old.compute(predictions=predictions, references=references, use_agregator=False)
        new = evaluate.load("rouge").compute(predictions=predictions, references=references)
    # rouge1 F of each pair, by hand: 1 and 2 * (1 * 2/3) / (1 + 2/3) = 0.8; their mean 0.9
    assert aggregated["rouge1"].mid.fmeasure == pytest.approx(0.9)
    assert aggregated["rouge1"].low.fmeasure <= 0.9 <= aggregated["rouge1"].high.fmeasure
    assert sorted(aggregated) == ["rouge1", "rouge2", "rougeL", "rougeLsum"]
    assert [score.fmeasure for score in each["rouge1"]] == [pytest.approx(1.0), pytest.approx(0.8)]
    assert each["rouge1"][1].precision == 1.0 and each["rouge1"][1].recall == pytest.approx(2 / 3)
    assert new["rouge1"] == pytest.approx(0.9)  # evaluate.load keeps evaluate's floats


def test_sacrebleu_corpus_bleu_with_its_counts_and_brevity_penalty():
    pytest.importorskip("sacrebleu")
    # "the cat sat on the mat" vs "the cat sat on a mat": n-gram matches 5/6, 3/5, 2/4, 1/3, same lengths (bp 1),
    # BLEU = 100 * (5/6 * 3/5 * 2/4 * 1/3) ** (1/4)
    result = compute(
        "sacrebleu", predictions=["the cat sat on the mat"], references=[["the cat sat on a mat"]]
    )
    assert result["score"] == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
    assert (result["counts"], result["totals"], result["bp"]) == ([5, 3, 2, 1], [6, 5, 4, 3], 1.0)
    assert (result["sys_len"], result["ref_len"]) == (6, 6)
    assert result["precisions"] == pytest.approx([500 / 6, 60.0, 50.0, 100 / 3])
    # every n-gram matches but 4 tokens against 6: the brevity penalty exp(1 - 6/4) alone
    short = compute("sacrebleu", predictions=["a b c d"], references=["a b c d e f"])
    assert short["score"] == pytest.approx(100 * math.exp(1 - 6 / 4))
    assert short["bp"] == pytest.approx(math.exp(-0.5))
    # several references per prediction: the closest one counts (each prediction equals one of its references)
    several = compute(
        "sacrebleu",
        predictions=["a b c d", "e f g h"],
        references=[["x y z w", "a b c d"], ["e f g h", "q r s t"]],
    )
    assert several["score"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="same number of references; the first has 2, others have \\[1\\]"):
        compute("sacrebleu", predictions=["a b", "c d"], references=[["a b", "x"], ["c d"]])


def test_wer_and_cer_sum_edits_over_all_reference_words_and_characters():
    pytest.importorskip("jiwer")
    # "a b c d" -> "a c": 2 deletions / 4 words; "x y" -> "x y z": 1 insertion / 2 words; together 3 / 6.
    # (The mean of the per-pair rates, (0.5 + 0.5) / 2, would be the same here; the next case tells them apart.)
    predictions, references = ["a c", "x y z"], ["a b c d", "x y"]
    assert compute("wer", predictions=predictions, references=references) == pytest.approx(3 / 6)
    # "one two three four" -> "one too": 1 substitution + 2 deletions over 4 words; "hi" -> "hi": 0 over 1.
    assert compute("wer", predictions=["one too", "hi"], references=["one two three four", "hi"]) == 3 / 5
    # Spaces around and between words do not count for wer; "cat" -> "cut ": 1 substitution / 3 characters.
    assert compute("wer", predictions=["  one   too "], references=["one two"]) == 1 / 2
    assert compute("cer", predictions=["cut "], references=["cat"]) == pytest.approx(1 / 3)
    # Hub examples: wer 0.5; cer 14 edits over 41 reference characters (spaces count as characters).
    hub_predictions = ["this is the prediction", "there is an other sample"]
    hub_references = ["this is the reference", "there is another one"]
    assert compute("wer", predictions=hub_predictions, references=hub_references) == 0.5
    assert compute("cer", predictions=hub_predictions, references=hub_references) == pytest.approx(14 / 41)
    # concatenate_texts: jiwer's figure for all pairs at once (the same totals here).
    assert compute(
        "wer", predictions=predictions, references=references, concatenate_texts=True
    ) == pytest.approx(0.5)


def test_add_batch_then_compute_is_evaluates_own_machinery():
    metric = build_metric("accuracy")
    metric.add_batch(predictions=[0, 1], references=[0, 0])
    metric.add(prediction=1, reference=1)
    assert metric.compute() == {"accuracy": pytest.approx(2 / 3)}


def test_every_served_metric_builds_under_its_hub_name():
    import importlib.util

    for name, entry in SERVED_METRICS.items():
        if entry.requires and importlib.util.find_spec(entry.requires) is None:
            continue
        assert build_metric(name, entry.configs[0] if entry.configs else None).name == name
