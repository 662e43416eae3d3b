"""The `seqeval` metric (named entities: entity-level precision, recall, F1) on the seqeval package.

As `evaluate.load("seqeval")` returns it: one entry per entity type (`{"precision", "recall", "f1",
"number"}`, `number` being how many entities of that type the references hold), then
`overall_precision`, `overall_recall`, `overall_f1` (micro averages over entities) and
`overall_accuracy` (per tag). Inputs are lists of tag sequences ("B-PER", "I-PER", "O", ...).
"""

from __future__ import annotations

import importlib

import datasets
import evaluate

from optimum_ipu.launcher.metrics._info import metric_info

__all__ = ["Seqeval"]

_SCHEMES = ("IOB1", "IOB2", "IOE1", "IOE2", "IOBES", "BILOU")


class Seqeval(evaluate.Metric):
    """`seqeval`: entity-level scores of tag sequences (needs the seqeval package)."""

    def _info(self):
        tags = datasets.Sequence(datasets.Value("string", id="label"), id="sequence")
        return metric_info(
            self, datasets.Features({"predictions": tags, "references": tags}),
            "predictions, references (lists of tag lists); suffix=False, scheme=None, mode=None, "
            "sample_weight=None, zero_division='warn'",
            "{TYPE: {'precision', 'recall', 'f1', 'number'}, 'overall_precision', 'overall_recall', "
            "'overall_f1', 'overall_accuracy'}",
        )  # fmt: skip

    def _compute(self, predictions, references, suffix=False, scheme=None, mode=None, sample_weight=None,
                 zero_division="warn"):  # fmt: skip
        from seqeval.metrics import accuracy_score, classification_report

        if scheme is not None:
            if scheme not in _SCHEMES:
                raise ValueError(f"seqeval: scheme must be one of {list(_SCHEMES)}, got {scheme!r}.")
            scheme = getattr(importlib.import_module("seqeval.scheme"), scheme)
        report = classification_report(
            y_true=references, y_pred=predictions, suffix=suffix, output_dict=True, scheme=scheme, mode=mode,
            sample_weight=sample_weight, zero_division=zero_division,
        )  # fmt: skip
        overall = report.pop("micro avg")
        for average in ("macro avg", "weighted avg"):
            report.pop(average)
        scores: dict = {
            entity: {
                "precision": s["precision"],
                "recall": s["recall"],
                "f1": s["f1-score"],
                "number": s["support"],
            }
            for entity, s in report.items()
        }
        scores["overall_precision"] = overall["precision"]
        scores["overall_recall"] = overall["recall"]
        scores["overall_f1"] = overall["f1-score"]
        scores["overall_accuracy"] = accuracy_score(y_true=references, y_pred=predictions)
        return scores
