"""Classification and regression metrics, as `evaluate.load(...)` returns them, on scikit-learn.

Each class is an `evaluate.Metric`, so `compute`, `add_batch`, `add` and the casting of inputs to
the declared features (int32 labels, float32 regression values) are evaluate's own; only the
scores are computed here. Keys, value types and options are those of the Hub metrics of the same
names (`accuracy`, `f1`, `precision`, `recall`, `matthews_correlation`, `mse`), which are thin
layers over the scikit-learn functions named in each docstring.
"""

from __future__ import annotations

import datasets
import evaluate
import numpy as np
from sklearn import metrics as sk

from optimum_ipu.launcher.metrics._info import metric_info

__all__ = ["Accuracy", "F1", "MatthewsCorrelation", "Mse", "Precision", "Recall"]


def _labels(config_name: str) -> datasets.Features:
    """int32 labels, or lists of them under the `multilabel` config (one 0/1 column per label)."""
    value = datasets.Value("int32")
    if config_name == "multilabel":
        value = datasets.Sequence(value)
    return datasets.Features({"predictions": value, "references": value})


def _scalar_or_array(score):
    """A float for one score; the per-label array as it is when `average=None` gives several."""
    return score if getattr(score, "size", 1) > 1 else float(score)


class Accuracy(evaluate.Metric):
    """`accuracy`: `sklearn.metrics.accuracy_score`; the share of exact matches (0 to 1), or their
    (weighted) count with `normalize=False`. Config `multilabel`: a sample counts only if all its
    labels match (subset accuracy)."""

    def _info(self):
        return metric_info(
            self, _labels(self.config_name), "predictions, references; normalize=True, sample_weight=None",
            "{'accuracy': float}",
        )  # fmt: skip

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        score = sk.accuracy_score(references, predictions, normalize=normalize, sample_weight=sample_weight)
        return {"accuracy": float(score)}


class F1(evaluate.Metric):
    """`f1`: `sklearn.metrics.f1_score` (0 to 1). `average` is "binary" (the `pos_label` class, the
    default), "micro", "macro", "weighted", "samples" (multilabel) or None (one score per label)."""

    def _info(self):
        return metric_info(
            self, _labels(self.config_name),
            "predictions, references; labels=None, pos_label=1, average='binary', sample_weight=None",
            "{'f1': float, or an array per label with average=None}",
        )  # fmt: skip

    def _compute(
        self, predictions, references, labels=None, pos_label=1, average="binary", sample_weight=None
    ):
        score = sk.f1_score(
            references,
            predictions,
            labels=labels,
            pos_label=pos_label,
            average=average,
            sample_weight=sample_weight,
        )
        return {"f1": _scalar_or_array(score)}


class Precision(evaluate.Metric):
    """`precision`: `sklearn.metrics.precision_score` (0 to 1), with the options of `f1` and
    `zero_division` (the value when nothing was predicted positive; "warn" gives 0 and a warning)."""

    def _info(self):
        return metric_info(
            self, _labels(self.config_name),
            "predictions, references; labels=None, pos_label=1, average='binary', sample_weight=None, "
            "zero_division='warn'",
            "{'precision': float, or an array per label with average=None}",
        )  # fmt: skip

    def _compute(self, predictions, references, labels=None, pos_label=1, average="binary", sample_weight=None,
                 zero_division="warn"):  # fmt: skip
        score = sk.precision_score(references, predictions, labels=labels, pos_label=pos_label, average=average,
                                   sample_weight=sample_weight, zero_division=zero_division)  # fmt: skip
        return {"precision": _scalar_or_array(score)}


class Recall(evaluate.Metric):
    """`recall`: `sklearn.metrics.recall_score` (0 to 1), with the options of `precision`."""

    def _info(self):
        return metric_info(
            self, _labels(self.config_name),
            "predictions, references; labels=None, pos_label=1, average='binary', sample_weight=None, "
            "zero_division='warn'",
            "{'recall': float, or an array per label with average=None}",
        )  # fmt: skip

    def _compute(self, predictions, references, labels=None, pos_label=1, average="binary", sample_weight=None,
                 zero_division="warn"):  # fmt: skip
        score = sk.recall_score(references, predictions, labels=labels, pos_label=pos_label, average=average,
                                sample_weight=sample_weight, zero_division=zero_division)  # fmt: skip
        return {"recall": _scalar_or_array(score)}


class MatthewsCorrelation(evaluate.Metric):
    """`matthews_correlation`: `sklearn.metrics.matthews_corrcoef` (-1 to 1; CoLA's GLUE score).
    Config `multilabel`: one coefficient per label column, or their mean with `average="macro"`."""

    def _info(self):
        return metric_info(
            self, _labels(self.config_name), "predictions, references; sample_weight=None, average=None (multilabel)",
            "{'matthews_correlation': float (a list per label for multilabel without average)}",
        )  # fmt: skip

    def _compute(self, predictions, references, sample_weight=None, average=None):
        if self.config_name != "multilabel":
            return {
                "matthews_correlation": float(
                    sk.matthews_corrcoef(references, predictions, sample_weight=sample_weight)
                )
            }
        predictions, references = np.asarray(predictions), np.asarray(references)
        if predictions.ndim != 2 or references.ndim != 2:
            raise ValueError(
                "matthews_correlation (multilabel): predictions and references must be 2-D (sample x label)."
            )
        per_label = [
            sk.matthews_corrcoef(predictions[:, j], references[:, j], sample_weight=sample_weight)
            for j in range(references.shape[1])
        ]
        if average is None:
            return {"matthews_correlation": per_label}
        if average != "macro":
            raise ValueError(f"matthews_correlation: average must be 'macro' or None, got {average!r}.")
        return {"matthews_correlation": np.mean(per_label)}


class Mse(evaluate.Metric):
    """`mse`: `sklearn.metrics.mean_squared_error`, or its square root with `squared=False`; inputs
    are float32 values (config `multilist`: lists of them, one column per output)."""

    def _info(self):
        value = datasets.Value("float")
        if self.config_name == "multilist":
            value = datasets.Sequence(value)
        return metric_info(
            self, datasets.Features({"predictions": value, "references": value}),
            "predictions, references; sample_weight=None, multioutput='uniform_average', squared=True",
            "{'mse': float (an array per output with multioutput='raw_values')}",
        )  # fmt: skip

    def _compute(
        self, predictions, references, sample_weight=None, multioutput="uniform_average", squared=True
    ):
        if squared:
            score = sk.mean_squared_error(
                references, predictions, sample_weight=sample_weight, multioutput=multioutput
            )
        elif hasattr(
            sk, "root_mean_squared_error"
        ):  # scikit-learn >= 1.4: the root per output, then averaged
            score = sk.root_mean_squared_error(references, predictions, sample_weight=sample_weight,
                                               multioutput=multioutput)  # fmt: skip
        else:
            score = sk.mean_squared_error(references, predictions, sample_weight=sample_weight,
                                          multioutput=multioutput, squared=False)  # fmt: skip
        return {"mse": score}
