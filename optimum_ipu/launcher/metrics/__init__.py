"""The metrics `optimum-ipu run` serves offline in place of `evaluate.load` / `datasets.load_metric`.

evaluate's wheel ships no metric scripts: `evaluate.load("accuracy")` downloads one from the Hub,
which fails offline. The launcher serves the common metrics of Optimum Graphcore's examples and
notebooks from this package instead, as `evaluate.Metric` modules with the Hub metrics' names,
config names, input features, options and result keys, computed on scikit-learn, scipy, numpy,
and the seqeval / rouge-score / sacrebleu / jiwer packages where the Hub metric uses them too.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from optimum_ipu.launcher._report import LauncherError

__all__ = ["SERVED_METRICS", "ServedMetric", "build_metric", "served_metric_name"]


@dataclass(frozen=True)
class ServedMetric:
    """A metric the launcher serves: where its class lives and the package it needs, if any.

    `datasets_target`: the class served to `datasets.load_metric` where datasets 2's metric of that name
    returned something else than evaluate's (rouge: rouge-score's `AggregateScore`s, not floats).
    """

    target: str
    requires: str | None = None
    install: str | None = None
    configs: tuple[str, ...] = ()
    datasets_target: str | None = None


_P = "optimum_ipu.launcher.metrics"
SERVED_METRICS: dict[str, ServedMetric] = {
    "accuracy": ServedMetric(f"{_P}.classification:Accuracy", configs=("multilabel",)),
    "f1": ServedMetric(f"{_P}.classification:F1", configs=("multilabel",)),
    "precision": ServedMetric(f"{_P}.classification:Precision", configs=("multilabel",)),
    "recall": ServedMetric(f"{_P}.classification:Recall", configs=("multilabel",)),
    "matthews_correlation": ServedMetric(f"{_P}.classification:MatthewsCorrelation", configs=("multilabel",)),
    "mse": ServedMetric(f"{_P}.classification:Mse", configs=("multilist",)),
    "pearsonr": ServedMetric(f"{_P}.correlation:Pearsonr"),
    "spearmanr": ServedMetric(f"{_P}.correlation:Spearmanr"),
    "glue": ServedMetric(
        f"{_P}.glue:Glue",
        configs=(
            "cola",
            "sst2",
            "mrpc",
            "qqp",
            "stsb",
            "mnli",
            "mnli_matched",
            "mnli_mismatched",
            "qnli",
            "rte",
            "wnli",
            "hans",
        ),
    ),  # fmt: skip
    "seqeval": ServedMetric(
        f"{_P}.sequence_labelling:Seqeval", requires="seqeval", install="pip install seqeval"
    ),
    "squad": ServedMetric(f"{_P}.squad:Squad"),
    "squad_v2": ServedMetric(f"{_P}.squad:SquadV2"),
    "perplexity": ServedMetric(f"{_P}.language_modelling:Perplexity"),
    "rouge": ServedMetric(
        f"{_P}.language_modelling:Rouge", requires="rouge_score", install="pip install rouge-score",
        datasets_target=f"{_P}.datasets_2:Rouge",
    ),
    "sacrebleu": ServedMetric(
        f"{_P}.translation:Sacrebleu", requires="sacrebleu", install="pip install sacrebleu"
    ),
    "wer": ServedMetric(f"{_P}.speech:Wer", requires="jiwer", install="pip install jiwer"),
    "cer": ServedMetric(f"{_P}.speech:Cer", requires="jiwer", install="pip install jiwer"),
}


def served_metric_name(path: str) -> str | None:
    """The served metric that `evaluate.load(path)` asks for, or None (another metric, or a local script).

    Hub spellings `evaluate-metric/accuracy` and `accuracy` are the same metric. A local metric script is the
    user's own module and is left to evaluate, as evaluate finds one: `path` itself, a `.py` file, or
    `path/NAME.py` in a folder named NAME. A folder without that script (a data set named `squad` beside
    the notebook) is not a metric to evaluate either, which goes to the Hub for it, and is served here.
    """
    import os

    script = path if path.endswith(".py") else os.path.join(path, os.path.basename(os.path.normpath(path)) + ".py")
    if os.path.isfile(script):
        return None
    name = path.removeprefix("evaluate-metric/")
    return name if name in SERVED_METRICS else None


def build_metric(name: str, config_name: str | None = None, for_load_metric: bool = False, **init_kwargs):
    """The served metric `name` as an `evaluate.Metric` instance (`init_kwargs` as evaluate.load passes them);
    `for_load_metric`: as datasets 2's `load_metric` returned it (`ServedMetric.datasets_target`).

    Raises:
        LauncherError: the metric needs a package that is not installed (the message says how to install it).
    """
    entry = SERVED_METRICS[name]
    if entry.requires and importlib.util.find_spec(entry.requires) is None:
        raise LauncherError(
            f"metric {name!r} needs the {entry.requires} package, which is not installed: {entry.install}"
        )
    target = entry.datasets_target if for_load_metric and entry.datasets_target else entry.target
    module_name, _, class_name = target.partition(":")
    metric_class = getattr(importlib.import_module(module_name), class_name)
    return metric_class(config_name=config_name, **init_kwargs)
