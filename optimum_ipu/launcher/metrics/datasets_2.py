"""Metrics as datasets 2's `load_metric` returned them, where evaluate's of the same name return something else.

`datasets.load_metric` (removed in datasets 3) ran the metric scripts of the datasets repository. Most of them
became evaluate's metrics unchanged; `rouge` did not: datasets 2's returned rouge-score's own result objects,
evaluate's returns floats. Code written for datasets 2 (Optimum Graphcore's summarization notebook) reads
`result["rouge1"].mid.fmeasure`, so `load_metric("rouge")` under `optimum-ipu run` serves this one.
"""

from __future__ import annotations

from optimum_ipu.launcher.metrics._info import metric_info
from optimum_ipu.launcher.metrics.language_modelling import Rouge as _EvaluateRouge
from optimum_ipu.launcher.metrics.language_modelling import rouge_aggregate, rouge_features, rouge_scores


class Rouge(_EvaluateRouge):
    """`rouge` as datasets 2 served it: an `AggregateScore` per rouge type (`low`, `mid` and `high` `Score`s of
    precision, recall and F-measure from rouge-score's bootstrap; evaluate's float is `mid.fmeasure`), or with
    `use_agregator=False` (datasets 2's spelling) a list of `Score`s, one per prediction (needs rouge-score)."""

    def _info(self):
        return metric_info(
            self, rouge_features(), "predictions, references; rouge_types=None, use_agregator=True, use_stemmer=False",
            "{'rouge1', 'rouge2', 'rougeL', 'rougeLsum'}: rouge-score's AggregateScore each (lists of Score with "
            "use_agregator=False)",
        )  # fmt: skip

    def _compute(self, predictions, references, rouge_types=None, use_agregator=True, use_stemmer=False):
        scores = rouge_scores(predictions, references, rouge_types, use_stemmer)
        if not use_agregator:
            return {key: [score[key] for score in scores] for key in scores[0]}
        return rouge_aggregate(scores)
