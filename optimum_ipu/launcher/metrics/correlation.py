"""Correlation metrics (`pearsonr`, `spearmanr`) as `evaluate.load(...)` returns them, on scipy.

Inputs are cast to float32, as the Hub metrics declare them. `return_pvalue=True` adds the
two-sided p-value of scipy's test.
"""

from __future__ import annotations

import datasets
import evaluate
from scipy import stats

from optimum_ipu.launcher.metrics._info import metric_info

__all__ = ["Pearsonr", "Spearmanr"]

_FLOATS = datasets.Features({"predictions": datasets.Value("float"), "references": datasets.Value("float")})


class Pearsonr(evaluate.Metric):
    """`pearsonr`: `scipy.stats.pearsonr` (-1 to 1), the linear correlation of predictions and references."""

    def _info(self):
        return metric_info(self, _FLOATS, "predictions, references; return_pvalue=False",
                           "{'pearsonr': float} (and 'p-value' with return_pvalue=True)")  # fmt: skip

    def _compute(self, predictions, references, return_pvalue=False):
        result = stats.pearsonr(references, predictions)
        if return_pvalue:
            return {"pearsonr": result[0], "p-value": result[1]}
        return {"pearsonr": float(result[0])}


class Spearmanr(evaluate.Metric):
    """`spearmanr`: `scipy.stats.spearmanr` (-1 to 1), the correlation of the ranks."""

    def _info(self):
        return metric_info(self, _FLOATS, "predictions, references; return_pvalue=False",
                           "{'spearmanr': float} (and 'spearmanr_pvalue' with return_pvalue=True)")  # fmt: skip

    def _compute(self, predictions, references, return_pvalue=False):
        result = stats.spearmanr(references, predictions)
        if return_pvalue:
            return {"spearmanr": result[0], "spearmanr_pvalue": result[1]}
        return {"spearmanr": result[0]}
