"""Comparing the setup a checkpoint was written with against the current run.

`compare_setup` diffs the checkpoint's `ipu_config.json` and combined batch with the current run's:
a layout-only change is one info line (weights do not depend on the layout); a change of the batch
arithmetic is an error naming each field and the flag that accepts it, with which the run continues
from the same number of samples. `check_same_model` refuses a checkpoint of another model.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimum_ipu.call_layout import CallLayout
from optimum_ipu.checkpoints.folders import (
    IPU_CONFIG,
    SAFE_WEIGHTS,
    json_kind,
    read_trainer_state,
    safetensors_shapes,
)

logger = logging.getLogger(__name__)

ACCEPT_BATCH_CHANGE_FLAG = "--allow_batch_change_on_resume"
# The batch arithmetic of a training step; a change to any of them changes what one step means.
BATCH_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "replication_factor",
    "device_iterations",
)
# IPU config fields that change neither the weights nor the batch arithmetic of training.
_NOT_COMPARED = ("seed", "executable_cache_dir")


# -- comparing the setup of a checkpoint with the current one ----------------------------------------


@dataclass
class SetupChange:
    """What differs between the run that wrote a checkpoint and the current one.

    Attributes:
        checkpoint: the checkpoint folder.
        batch: changed batch-arithmetic fields, name -> (saved, current).
        layout: other changed IPU config fields (layout, memory savers), name -> (saved, current).
        saved_step: the checkpoint's global step.
        saved_combined_batch / combined_batch: samples per training step then and now.
    """

    checkpoint: str
    batch: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    layout: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    saved_step: int = 0
    saved_combined_batch: int = 0
    combined_batch: int = 0

    @property
    def samples_seen(self) -> int:
        """Training samples consumed when the checkpoint was written."""
        return self.saved_step * self.saved_combined_batch

    @property
    def resumed_step(self) -> int:
        """The step of the current setup that has consumed the same samples (rounded down)."""
        return self.samples_seen // self.combined_batch if self.combined_batch else self.saved_step

    @staticmethod
    def describe(fields: dict[str, tuple[Any, Any]]) -> str:
        return ", ".join(f"{name} {old} -> {new}" for name, (old, new) in fields.items())

    def batch_message(self) -> str:
        lost = self.samples_seen - self.resumed_step * self.combined_batch
        redo = f"; the last {lost} of them are trained again" if lost else ""
        return (
            f"{self.checkpoint} was written with a different batch arithmetic ({self.describe(self.batch)}): "
            f"combined batch {self.saved_combined_batch} -> {self.combined_batch}. Its {self.saved_step} steps "
            f"consumed {self.samples_seen} samples, so training continues at step {self.resumed_step} of the "
            f"new setup (epochs, data position and learning-rate schedule follow the samples{redo})"
        )


def _saved_ipu_config(checkpoint: Path) -> dict[str, Any] | None:
    """The checkpoint's `ipu_config.json` as a dict, None without one; a `ValueError` naming it when unusable."""
    path = checkpoint / IPU_CONFIG
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as error:
        raise ValueError(
            f"{path} is not valid JSON ({error}); restore it from the run's output folder or "
            "delete the checkpoint."
        ) from None
    if not isinstance(saved, dict):
        raise ValueError(
            f"{path} is {json_kind(saved)}, not a JSON object; restore it from the run's output folder or "
            "delete the checkpoint."
        )
    return saved


def compare_setup(checkpoint: str | os.PathLike, ipu_config, micro_batch_size: int) -> SetupChange | None:
    """Diff a checkpoint's setup (its `ipu_config.json` and combined batch) with the current run's.

    Training values only: inference settings, the seed and the executable cache do not matter for
    resuming. The saved micro-batch is the saved combined batch divided by the saved config's
    GA x replicas x device iterations. Returns None when the checkpoint has no `ipu_config.json`
    (written by plain transformers: nothing to compare). An `ipu_config.json` or `trainer_state.json`
    that is not a JSON object, or a string where a number belongs, is a `ValueError` naming the file.
    """
    from optimum_ipu.configuration.schema import FIELD_DEFAULTS, derive_defaults

    checkpoint = Path(checkpoint)
    saved = _saved_ipu_config(checkpoint)
    if saved is None:
        return None
    state = read_trainer_state(checkpoint)  # an object with numbers where numbers belong, else a named error
    current = ipu_config.to_dict()
    # A field the file leaves out (an older or hand-written config) is derived as loading the file would
    # (ipus_per_replica from layers_per_ipu), not compared as its raw default None.
    given = {name for name, value in saved.items() if value is not None}
    saved = derive_defaults({name: saved.get(name, default) for name, default in FIELD_DEFAULTS.items()},
                            given)  # fmt: skip
    factor = CallLayout(saved["device_iterations"], saved["replication_factor"],
                        saved["gradient_accumulation_steps"]).micro_batches
    saved_combined = state.get("train_batch_size") or factor * micro_batch_size
    saved["per_device_train_batch_size"] = max(1, saved_combined // factor)
    current["per_device_train_batch_size"] = micro_batch_size
    change = SetupChange(str(checkpoint), saved_step=int(state.get("global_step", 0)),
                         saved_combined_batch=int(saved_combined),
                         combined_batch=micro_batch_size * ipu_config.batch_size_factor())  # fmt: skip
    for name in dict.fromkeys((*BATCH_FIELDS, *FIELD_DEFAULTS)):  # each name once, the batch fields first
        if name.startswith("inference_") or name in _NOT_COMPARED:
            continue
        old, new = saved.get(name), current.get(name)
        if old != new:
            (change.batch if name in BATCH_FIELDS else change.layout)[name] = (old, new)
    return change


def check_same_model(checkpoint: str | os.PathLike, model) -> None:
    """Raise a `ValueError` when the checkpoint's weights do not fit `model` (another model's checkpoint).

    Compares tensor names and shapes from the safetensors header with the model's state dict, so the
    error names the checkpoint before transformers fails inside `load_state_dict`. A header that cannot
    be read is a `ValueError` naming the file (from `safetensors_shapes`).
    """
    weights = Path(checkpoint) / SAFE_WEIGHTS
    if not weights.is_file():
        return
    saved = safetensors_shapes(weights)
    current = {name: list(tensor.shape) for name, tensor in model.state_dict().items()}
    common = saved.keys() & current.keys()
    mismatched = [f"{name} {saved[name]} in the checkpoint vs {current[name]} in the model"
                  for name in sorted(common) if saved[name] != current[name]]  # fmt: skip
    if common and not mismatched:
        return
    detail = (
        "; ".join(mismatched[:3])
        if mismatched
        else (
            f"none of its {len(saved)} tensor names is one of the model's (e.g. {sorted(saved)[:2]} vs {sorted(current)[:2]})"
        )
    )
    raise ValueError(
        f"{checkpoint} holds the weights of another model: {detail}. Resume from a checkpoint of this "
        "model (the same --model_name_or_path and config), or use another --output_dir."
    )
