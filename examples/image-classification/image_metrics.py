"""Evaluation metrics for image classification: per-finding ROC AUC (multi-label) and accuracy.

ChestX-ray14 is multi-label: an image can show several findings, or none. Each finding is its own
yes/no decision, so scores are per-finding sigmoids of the logits and the metric is each finding's
ROC AUC, then their unweighted (macro) mean. Graphcore's walkthrough took a softmax over findings
(which makes findings compete, as if exactly one were present) and ``argmax``; that is wrong here.
A finding with only positives or only negatives in the evaluation set has no ROC AUC; it is left
out of the mean (and reported as NaN) instead of failing the whole evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import expit
from sklearn.metrics import roc_auc_score


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """The logistic function, without overflow warnings for large logits."""
    return expit(np.asarray(logits, dtype=np.float64))


def multilabel_roc_auc(logits: np.ndarray, labels: np.ndarray, names: Sequence[str]) -> dict[str, float]:
    """``roc_auc`` (macro over findings that have both classes) and ``roc_auc_<name>`` per finding.

    Args:
        logits: ``[samples, findings]`` raw model outputs (sigmoid is monotonic, so AUC on logits
            equals AUC on probabilities; sigmoid is applied anyway to report scores as probabilities).
        labels: ``[samples, findings]`` 0/1.
        names: one name per finding column.
    """
    scores, labels = sigmoid(logits), np.asarray(labels)
    if scores.shape != labels.shape or scores.shape[1] != len(names):
        raise ValueError(f"Shapes disagree: logits {scores.shape}, labels {labels.shape}, {len(names)} names.")
    result, defined = {}, []
    for column, name in enumerate(names):
        truth = labels[:, column] >= 0.5
        if truth.all() or not truth.any():
            result[f"roc_auc_{name}"] = math.nan
            continue
        auc = float(roc_auc_score(truth, scores[:, column]))
        result[f"roc_auc_{name}"] = auc
        defined.append(auc)
    result["roc_auc"] = float(np.mean(defined)) if defined else math.nan
    result["roc_auc_findings_scored"] = float(len(defined))
    return result


def accuracy(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Single-label top-1 accuracy."""
    predictions = np.asarray(logits).argmax(axis=-1)
    return {"accuracy": float((predictions == np.asarray(labels)).mean())}
