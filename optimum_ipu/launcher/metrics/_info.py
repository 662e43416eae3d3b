"""The `evaluate.MetricInfo` of a metric served by the launcher: its features and a usage text."""

from __future__ import annotations

import datasets
import evaluate

__all__ = ["metric_info"]


def metric_info(metric: evaluate.Metric, features: datasets.Features | list[datasets.Features], usage: str,
                returns: str, **extra) -> evaluate.MetricInfo:  # fmt: skip
    """Info for `metric`: its inputs' `features` (as the Hub metric declares them, so inputs are cast
    the same way), and a usage line that says the copy is optimum-ipu's offline one."""
    description = (metric.__doc__ or "").strip()
    return evaluate.MetricInfo(
        description=f"{description}\n\nServed offline by optimum-ipu's launcher (`optimum-ipu run`).",
        citation="",
        inputs_description=f"Args: {usage}. Returns: {returns}.",
        features=features,
        **extra,
    )
