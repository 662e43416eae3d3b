"""Speech recognition error rates (`wer`, `cer`) as `evaluate.load(...)` returns them, on the jiwer package.

Both are edit distances over the whole evaluation set: the substitutions, deletions and insertions of
every (reference, prediction) pair summed, over the words (or characters) of all the references,
as the Hub metrics compute them with jiwer's default transforms (surrounding spaces stripped; for
`wer` repeated spaces count as one). They return a float, not a dict, as the Hub metrics do (the
CTC example stores it as `{"wer": value}`). With `concatenate_texts=True`, jiwer's figure for all
the pairs at once. Lower is better; 0 is a perfect transcription, and insertions can take it past 1.
"""

from __future__ import annotations

import datasets
import evaluate

from optimum_ipu.launcher.metrics._info import metric_info

__all__ = ["Cer", "Wer"]

_TEXTS = datasets.Features(
    {
        "predictions": datasets.Value("string", id="sequence"),
        "references": datasets.Value("string", id="sequence"),
    }
)


def _error_rate(process, predictions, references, concatenate_texts: bool) -> float:
    if concatenate_texts:
        output = process(list(references), list(predictions))
        return float(output.wer if hasattr(output, "wer") else output.cer)
    errors = total = 0
    for prediction, reference in zip(predictions, references):
        output = process(reference, prediction)
        errors += output.substitutions + output.deletions + output.insertions
        total += output.substitutions + output.deletions + output.hits
    return errors / total


class Wer(evaluate.Metric):
    """`wer`: word error rate, (S + D + I) / N over the reference words (needs the jiwer package)."""

    def _info(self):
        return metric_info(self, _TEXTS, "predictions, references (strings); concatenate_texts=False",
                           "float (the word error rate, 0 = perfect)")  # fmt: skip

    def _compute(self, predictions, references, concatenate_texts=False):
        import jiwer

        return _error_rate(jiwer.process_words, predictions, references, concatenate_texts)


class Cer(evaluate.Metric):
    """`cer`: character error rate, (S + D + I) / N over the reference characters (needs the jiwer package)."""

    def _info(self):
        return metric_info(self, _TEXTS, "predictions, references (strings); concatenate_texts=False",
                           "float (the character error rate, 0 = perfect)")  # fmt: skip

    def _compute(self, predictions, references, concatenate_texts=False):
        import jiwer

        return _error_rate(jiwer.process_characters, predictions, references, concatenate_texts)
