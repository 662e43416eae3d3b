"""The walkthrough's plots, drawn from the trainer's log history instead of captured stdout.

Graphcore's ChestX-ray notebook redirected stdout and parsed printed dicts to plot the loss and the
learning rate; `Trainer.state.log_history` already holds the same records. PNGs are written with
matplotlib's Agg back end, so no display is needed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the back end must be chosen first


def training_curves(log_history: Sequence[Mapping], output_dir: str,
                    file_name: str = "training_curves.png") -> str | None:
    """Plot training loss and learning rate against the optimizer step; ``None`` if nothing was logged."""
    records = [r for r in log_history if "loss" in r and "step" in r]
    if not records:
        return None
    steps = [r["step"] for r in records]
    figure, (loss_axis, lr_axis) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    loss_axis.plot(steps, [r["loss"] for r in records], marker=".")
    loss_axis.set_ylabel("training loss")
    loss_axis.grid(alpha=0.3)
    lr_records = [r for r in records if "learning_rate" in r]
    lr_axis.plot([r["step"] for r in lr_records], [r["learning_rate"] for r in lr_records], color="tab:orange")
    lr_axis.set_ylabel("learning rate")
    lr_axis.set_xlabel("step (one combined batch)")
    lr_axis.grid(alpha=0.3)
    figure.tight_layout()
    path = os.path.join(output_dir, file_name)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def auc_bars(per_finding: Mapping[str, float], macro: float, output_dir: str,
             file_name: str = "roc_auc_per_finding.png") -> str:
    """A horizontal bar per finding's ROC AUC with the macro average marked."""
    names = list(per_finding)
    figure, axis = plt.subplots(figsize=(8, 0.35 * len(names) + 1.5))
    axis.barh(names, [per_finding[n] for n in names], color="tab:blue")
    axis.axvline(macro, color="tab:red", linestyle="--", label=f"macro {macro:.3f}")
    axis.axvline(0.5, color="grey", linestyle=":", label="chance")
    axis.set_xlim(0, 1)
    axis.set_xlabel("ROC AUC (validation)")
    axis.invert_yaxis()
    axis.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    figure.tight_layout()
    path = os.path.join(output_dir, file_name)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
