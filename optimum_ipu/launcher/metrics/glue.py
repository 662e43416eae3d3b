"""The `glue` metric, per GLUE task (its config name), as `evaluate.load("glue", task)` returns it.

| config | result |
|---|---|
| cola | `matthews_correlation` |
| stsb | `pearson`, `spearmanr` (float32 inputs) |
| mrpc, qqp | `accuracy`, `f1` (of class 1) |
| sst2, mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli, hans | `accuracy` |

All on a 0-1 scale. Inputs reach `_compute` as numpy arrays (the Hub metric's format).
"""

from __future__ import annotations

import datasets
import evaluate
from scipy import stats
from sklearn import metrics as sk

from optimum_ipu.launcher.metrics._info import metric_info

__all__ = ["GLUE_CONFIGS", "Glue"]

_ACCURACY_ONLY = ("sst2", "mnli", "mnli_mismatched", "mnli_matched", "qnli", "rte", "wnli", "hans")
GLUE_CONFIGS = ("cola", "stsb", "mrpc", "qqp", *_ACCURACY_ONLY)


class Glue(evaluate.Metric):
    """`glue`: the score of one GLUE task, chosen by the config name (cola, sst2, mrpc, stsb, ...)."""

    def _info(self):
        if self.config_name not in GLUE_CONFIGS:
            raise KeyError(
                f"glue: the config name must be one of {list(GLUE_CONFIGS)}, got {self.config_name!r}."
            )
        dtype = "float32" if self.config_name == "stsb" else "int64"
        features = datasets.Features(
            {"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)}
        )
        return metric_info(
            self, features, "predictions, references", "a dict of the task's scores", format="numpy"
        )

    def _compute(self, predictions, references):
        task = self.config_name
        if task == "cola":
            return {"matthews_correlation": sk.matthews_corrcoef(references, predictions)}
        if task == "stsb":
            return {
                "pearson": float(stats.pearsonr(predictions, references)[0]),
                "spearmanr": float(stats.spearmanr(predictions, references)[0]),
            }
        accuracy = float((predictions == references).mean())
        if task in ("mrpc", "qqp"):
            return {"accuracy": accuracy, "f1": float(sk.f1_score(y_true=references, y_pred=predictions))}
        return {"accuracy": accuracy}
