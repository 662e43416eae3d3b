"""Shim for `Trainer.train(resume_from_checkpoint=MODEL_FOLDER)`, which transformers 4 accepted and v5 refuses.

Optimum Graphcore 0.7's `run_speech_recognition_ctc.py` resumes "from" its `--model_name_or_path`
whenever that is a local folder: a model folder, not a checkpoint (no `trainer_state.json`,
optimizer or scheduler). transformers 4 loaded the folder's weights into the model once more (the
model the script had just loaded from that same folder) and trained from step 0; transformers 5 (and
`IPUTrainer`'s complete-checkpoint check) stop on the missing `trainer_state.json`. The shim trains
from step 0 with the model as loaded. A folder that holds any of a checkpoint's training-state files
is a checkpoint, and is left to the trainer (an incomplete one still stops the run).
"""

from __future__ import annotations

import functools
import importlib
import os

from optimum_ipu.launcher._report import note_once
from optimum_ipu.launcher.shims._base import Shim, Skip
from optimum_ipu.launcher.shims._patch import Patches

__all__ = ["RESUME_FROM_MODEL_FOLDER", "is_model_folder"]

_TRAINING_STATE = ("trainer_state.json", "optimizer.pt", "scheduler.pt")


def is_model_folder(path) -> bool:
    """True for a saved model (a folder with `config.json`) that holds none of a checkpoint's training-state files."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        return False
    names = set(os.listdir(path))
    return "config.json" in names and not names.intersection(_TRAINING_STATE)


def _wrap_train(train):
    @functools.wraps(train)
    def wrapped(self, resume_from_checkpoint=None, *args, **kwargs):
        if is_model_folder(resume_from_checkpoint):
            note_once("resume_from_model_folder", f"train(resume_from_checkpoint={os.fspath(resume_from_checkpoint)!r}): a model "
                      "folder, not a checkpoint (no trainer_state.json). transformers 4 reloaded its weights and trained from "
                      "step 0, transformers 5 stops: training from step 0 with the model as loaded.")  # fmt: skip
            resume_from_checkpoint = None
        return train(self, resume_from_checkpoint, *args, **kwargs)

    return wrapped


# The trainers whose `train` a script calls: transformers' own, and IPUTrainer (which checks its checkpoint first).
_TRAINERS = ("transformers:Trainer", "optimum_ipu.trainer:IPUTrainer")


def _install_resume(patches: Patches) -> Skip | None:
    for target in _TRAINERS:
        module_name, _, name = target.partition(":")
        owner = getattr(importlib.import_module(module_name), name)
        patches.set(owner, "train", _wrap_train(owner.__dict__["train"]))
    return None


RESUME_FROM_MODEL_FOLDER = Shim(
    name="resume_from_checkpoint",
    replaces="`trainer.train(resume_from_checkpoint=MODEL_FOLDER)` with a saved model rather than a checkpoint "
    "(run_speech_recognition_ctc.py passes its --model_name_or_path): transformers 4 trained from step 0, v5 stops",
    by="training from step 0 with the model as the script loaded it, when the folder holds a `config.json` and none "
    "of a checkpoint's `trainer_state.json`, `optimizer.pt`, `scheduler.pt`; a checkpoint folder is left to the trainer",
    install=_install_resume,
)
