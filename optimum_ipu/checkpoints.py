"""Checkpoints that are complete or do not exist, and resuming from them with a changed setup.

A run that is killed while it saves (pre-emption, an out-of-memory, a wall-clock limit, Ctrl-C) must
not leave a `checkpoint-N` folder that looks like a checkpoint but is not one: every Hugging Face
script resumes from the newest folder with that name and dies on the missing files. So:

- **Atomic save.** `AtomicCheckpoints._save_checkpoint` lets transformers write the checkpoint into a
  staging folder beside the real one (`.incomplete-checkpoint-N/checkpoint-N`: same file system, a
  name that neither `checkpoint-\\d+$` nor the Trainer's `checkpoint-*` rotation glob matches),
  flushes every file to disk, and renames it into place as the very last step. `save_total_limit`
  rotation runs only after the rename, and renames a folder away before deleting it. A staging folder left by a killed run is removed at the next
  save, with one log line. With several processes, all write their parts into the same staging
  folder and only the saving process renames it, after a barrier.
- **Complete means loadable.** `checkpoint_problems` is the one definition: the trainer state, the
  weights (not truncated), and, unless `save_only_model`, the optimizer and scheduler.
  `get_last_checkpoint` (exported as `optimum_ipu.get_last_checkpoint`) and
  `train(resume_from_checkpoint=True)` skip folders that fail it, saying which and why.
- **A changed setup is named.** `compare_setup` diffs the checkpoint's `ipu_config.json` and batch
  size against the current run: a layout-only change is one info line (weights do not depend on the
  layout); a change of the batch arithmetic is an error naming each field and the flag that accepts
  it (`--allow_batch_change_on_resume`), with which the run continues from the same number of samples.

Only this module touches private `Trainer` methods (`_save_checkpoint`, `_get_output_dir`,
`_init_training_state`, `_load_optimizer_and_scheduler`); `tests/test_checkpoints.py` pins the
transformers contract they rely on, and the code raises instead of guessing when it changes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "AtomicCheckpoints",
    "SetupChange",
    "checkpoint_problems",
    "compare_setup",
    "get_last_checkpoint",
    "is_complete_checkpoint",
]

logger = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint"
CHECKPOINT_RE = re.compile(rf"^{CHECKPOINT_PREFIX}-(\d+)$")
STAGING_PREFIX = ".incomplete-checkpoint-"
TRAINER_STATE = "trainer_state.json"
IPU_CONFIG = "ipu_config.json"
SAFE_WEIGHTS = "model.safetensors"
WEIGHT_FILES = (SAFE_WEIGHTS, "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
                "adapter_model.safetensors", "adapter_model.bin")  # fmt: skip
TRAINING_STATE_FILES = ("optimizer.pt", "scheduler.pt")
ACCEPT_BATCH_CHANGE_FLAG = "--allow_batch_change_on_resume"

# The batch arithmetic of a training step; a change to any of them changes what one step means.
BATCH_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "replication_factor", "device_iterations")
# IPU config fields that change neither the weights nor the batch arithmetic of training.
_NOT_COMPARED = ("seed", "executable_cache_dir")


# -- what a complete checkpoint is ---------------------------------------------------------------


def _safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file cannot load (truncated, bad header), or None; reads the header only."""
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            header_size = int.from_bytes(handle.read(8), "little")
            if size < 8 or 8 + header_size > size:
                return f"{path.name} is truncated ({size} bytes, shorter than its own header)"
            header = json.loads(handle.read(header_size))
    except (OSError, ValueError) as error:
        return f"{path.name} has no readable safetensors header ({error})"
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    needed = 8 + header_size + max(ends, default=0)
    if size < needed:
        return f"{path.name} is truncated ({size} of {needed} bytes)"
    return None


def safetensors_shapes(path: str | os.PathLike) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors header, without reading the tensors."""
    with open(path, "rb") as handle:
        header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
    return {key: entry["shape"] for key, entry in header.items() if key != "__metadata__"}


def checkpoint_problems(path: str | os.PathLike, save_only_model: bool = False) -> list[str]:
    """Why `path` is not a complete checkpoint; an empty list when it is one.

    Complete means what resuming needs: `trainer_state.json` with a `global_step`, the model weights
    (a safetensors file must hold every byte its header describes), and, unless `save_only_model`,
    `optimizer.pt` and `scheduler.pt` (readable torch files). Only headers are read, so checking a
    large checkpoint is cheap.
    """
    path = Path(path)
    if not path.is_dir():
        return [f"{path} is not a folder"]
    problems = []
    state = path / TRAINER_STATE
    if not state.is_file():
        problems.append(f"no {TRAINER_STATE}")
    else:
        try:
            if "global_step" not in json.loads(state.read_text()):
                problems.append(f"{TRAINER_STATE} has no global_step")
        except (OSError, ValueError) as error:
            problems.append(f"{TRAINER_STATE} is not valid JSON ({error})")
    weights = [path / name for name in WEIGHT_FILES if (path / name).is_file()]
    if not weights:
        problems.append(f"no weights ({SAFE_WEIGHTS})")
    elif weights[0].name.endswith(".safetensors"):
        problem = _safetensors_problem(weights[0])
        if problem:
            problems.append(problem)
    if not save_only_model:
        for name in TRAINING_STATE_FILES:
            file = path / name
            if not file.is_file():
                problems.append(f"no {name}")
            elif not zipfile.is_zipfile(file):
                problems.append(f"{name} is truncated or not a torch file")
    return problems


def is_complete_checkpoint(path: str | os.PathLike, save_only_model: bool = False) -> bool:
    """True when `checkpoint_problems(path, save_only_model)` finds nothing."""
    return not checkpoint_problems(path, save_only_model)


def _numbered_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """`checkpoint-N` sub-folders as (N, path), newest first."""
    found = []
    for entry in folder.iterdir():
        match = CHECKPOINT_RE.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def get_last_checkpoint(folder: str | os.PathLike, save_only_model: bool = False) -> str | None:
    """The newest complete `checkpoint-N` in `folder`, or None; incomplete ones are skipped and logged.

    A drop-in for `transformers.trainer_utils.get_last_checkpoint`, which takes any folder with that
    name, including one left half-written by a killed run (or by an older version of this package).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    for _, path in _numbered_checkpoints(folder):
        problems = checkpoint_problems(path, save_only_model)
        if not problems:
            return str(path)
        logger.warning("Skipping %s: not a complete checkpoint (%s).", path, "; ".join(problems))
    return None


def check_resumable(path: str | os.PathLike, save_only_model: bool = False) -> str:
    """`path` if it is a complete checkpoint, else a `FileNotFoundError` naming what is missing and what to do."""
    problems = checkpoint_problems(path, save_only_model)
    if not problems:
        return str(path)
    parent = Path(path).parent
    other = get_last_checkpoint(parent, save_only_model) if parent.is_dir() else None
    hint = f"resume from {other} (the newest complete one) instead" if other else "start without --resume_from_checkpoint"
    raise FileNotFoundError(
        f"Cannot resume from {path}: it is not a complete checkpoint ({'; '.join(problems)}). "
        f"It was probably written by a run that was killed while saving; {hint}, or delete the folder."
    )


# -- writing a checkpoint atomically -----------------------------------------------------------------


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on folders; the rename is still atomic there
        pass
    finally:
        os.close(fd)


def flush_tree(folder: str | os.PathLike) -> None:
    """fsync every file and folder under `folder`, so a rename after it never exposes unwritten data."""
    folder = Path(folder)
    for root, _, files in os.walk(folder, topdown=False):
        for name in files:
            _fsync(Path(root) / name)
        _fsync(Path(root))


def staging_folder(run_dir: str | os.PathLike, step: int) -> Path:
    """The folder transformers writes checkpoint `step` into before it is renamed into place."""
    return Path(run_dir) / f"{STAGING_PREFIX}{step}"


def remove_leftover_staging(run_dir: str | os.PathLike) -> list[Path]:
    """Delete staging folders that a killed run left in `run_dir`; one log line when there were any."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    leftovers = sorted(p for p in run_dir.iterdir() if p.name.startswith(STAGING_PREFIX) and p.is_dir())
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    if leftovers:
        logger.info("Removed %d incomplete checkpoint(s) left by an interrupted run: %s",
                    len(leftovers), ", ".join(p.name for p in leftovers))  # fmt: skip
    return leftovers


def publish(staged: str | os.PathLike, final: str | os.PathLike) -> None:
    """Flush `staged` and rename it to `final` as the last step; an existing `final` is replaced.

    Until the rename, `final` is either absent or the previous complete checkpoint of that step, so a
    kill at any moment leaves nothing half-written under a `checkpoint-N` name.
    """
    staged, final = Path(staged), Path(final)
    flush_tree(staged)
    old = None
    if final.exists():  # the same step saved again (a resumed run): keep the old one until the new is in place
        old = final.parent / f"{STAGING_PREFIX}{final.name}-replaced"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(staged, final)
    _fsync(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def rotate(run_dir: str | os.PathLike, save_total_limit: int | None, protected: list[str | None]) -> list[Path]:
    """Keep the newest `save_total_limit` checkpoints (and the `protected` ones); return those removed.

    A folder is first renamed out of the `checkpoint-N` namespace, then deleted, so a kill during the
    deletion leaves a staging folder (removed at the next save), never a half-deleted checkpoint.
    """
    if not save_total_limit or save_total_limit <= 0:
        return []
    run_dir = Path(run_dir)
    keep = {Path(p).resolve() for p in protected if p}
    oldest_first = [path for _, path in reversed(_numbered_checkpoints(run_dir))]
    removable = [path for path in oldest_first if path.resolve() not in keep]
    excess = len(oldest_first) - max(save_total_limit, len(keep))
    removed = removable[: max(0, excess)]
    for path in removed:
        doomed = run_dir / f"{STAGING_PREFIX}{path.name}-rotated"
        os.replace(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    if removed:
        logger.info("Deleted %s (save_total_limit=%d).", ", ".join(p.name for p in removed), save_total_limit)
    return removed


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
    path = checkpoint / IPU_CONFIG
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); restore it from the run's output folder or "
                         "delete the checkpoint.") from None


def compare_setup(checkpoint: str | os.PathLike, ipu_config, micro_batch_size: int) -> SetupChange | None:
    """Diff a checkpoint's setup (its `ipu_config.json` and combined batch) with the current run's.

    Training values only: inference settings, the seed and the executable cache do not matter for
    resuming. The saved micro-batch is the saved combined batch divided by the saved config's
    GA x replicas x device iterations. Returns None when the checkpoint has no `ipu_config.json`
    (written by plain transformers: nothing to compare).
    """
    from optimum_ipu._config_schema import FIELD_DEFAULTS

    checkpoint = Path(checkpoint)
    saved = _saved_ipu_config(checkpoint)
    if saved is None:
        return None
    state = json.loads((checkpoint / TRAINER_STATE).read_text())
    current = ipu_config.to_dict()
    saved = {name: saved.get(name, default) for name, default in FIELD_DEFAULTS.items()}
    factor = saved["gradient_accumulation_steps"] * saved["replication_factor"] * saved["device_iterations"]
    saved_combined = state.get("train_batch_size") or factor * micro_batch_size
    saved["per_device_train_batch_size"] = max(1, saved_combined // factor)
    current["per_device_train_batch_size"] = micro_batch_size
    change = SetupChange(str(checkpoint), saved_step=int(state.get("global_step", 0)),
                         saved_combined_batch=int(saved_combined),
                         combined_batch=micro_batch_size * ipu_config.batch_size_factor())  # fmt: skip
    for name in (*BATCH_FIELDS, *FIELD_DEFAULTS):
        if name.startswith("inference_") or name in _NOT_COMPARED or name in change.batch or name in change.layout:
            continue
        old, new = saved.get(name), current.get(name)
        if old != new:
            (change.batch if name in BATCH_FIELDS else change.layout)[name] = (old, new)
    return change


def check_same_model(checkpoint: str | os.PathLike, model) -> None:
    """Raise a `ValueError` when the checkpoint's weights do not fit `model` (another model's checkpoint).

    Compares tensor names and shapes from the safetensors header with the model's state dict, so the
    error names the checkpoint before transformers fails inside `load_state_dict`.
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
    detail = "; ".join(mismatched[:3]) if mismatched else (
        f"none of its {len(saved)} tensor names is one of the model's (e.g. {sorted(saved)[:2]} vs {sorted(current)[:2]})"
    )
    raise ValueError(
        f"{checkpoint} holds the weights of another model: {detail}. Resume from a checkpoint of this "
        "model (the same --model_name_or_path and config), or use another --output_dir."
    )


# -- the Trainer side ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _instance_override(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Shadow a method or attribute on one instance, restoring exactly what was there."""
    had = name in vars(obj)
    saved = vars(obj).get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, saved)
        else:
            delattr(obj, name)


class AtomicCheckpoints:
    """Trainer mixin: atomic checkpoints, resuming from the newest complete one, setup comparison.

    Put it before `transformers.Trainer` in the bases (`class IPUTrainer(AtomicCheckpoints, Trainer)`).
    It needs `self.ipu_config` (the effective IPU config) from the trainer.
    """

    _resume_change: SetupChange | None = None

    # -- saving ---------------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial) -> None:
        """transformers' checkpoint, written into a staging folder and renamed into place last."""
        args = self.args
        step = self.state.global_step
        run_dir = Path(self._get_output_dir(trial=trial))
        staging = staging_folder(run_dir, step)
        staged = staging / f"{CHECKPOINT_PREFIX}-{step}"
        final = run_dir / f"{CHECKPOINT_PREFIX}-{step}"
        if args.should_save:
            remove_leftover_staging(run_dir)
        self.accelerator.wait_for_everyone()  # nobody writes into a staging folder that is being removed

        # transformers joins _get_output_dir() and "checkpoint-N"; rotation is ours, after the rename.
        with _instance_override(self, "_get_output_dir", lambda trial=None: str(staging)), \
                _instance_override(args, "save_total_limit", None):  # fmt: skip
            super()._save_checkpoint(model, trial)

        self.accelerator.wait_for_everyone()  # every process has written its part
        if args.should_save:
            if not staged.is_dir():
                raise RuntimeError(
                    f"transformers' Trainer._save_checkpoint did not write into {staged}: its contract with "
                    "_get_output_dir() changed. optimum-ipu's atomic checkpoints need an update for this "
                    "transformers version (see tests/test_checkpoints.py)."
                )
            if self.state.best_model_checkpoint == str(staged):
                self.state.best_model_checkpoint = str(final)
                self.state.save_to_json(str(staged / TRAINER_STATE))
            publish(staged, final)
            shutil.rmtree(staging, ignore_errors=True)
            rotate(run_dir, args.save_total_limit, [str(final), self.state.best_model_checkpoint])
        self.accelerator.wait_for_everyone()

    # -- resuming -------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """Resolve `resume_from_checkpoint` to a complete checkpoint and check its setup, then train."""
        checkpoint = self._checkpoint_to_resume(resume_from_checkpoint)
        self._resume_change = self._check_setup(checkpoint) if checkpoint is not None else None
        return super().train(checkpoint, trial, ignore_keys_for_eval, **kwargs)

    def _checkpoint_to_resume(self, resume_from_checkpoint) -> str | None:
        if resume_from_checkpoint is None or resume_from_checkpoint is False:
            return None
        save_only_model = bool(self.args.save_only_model)
        if resume_from_checkpoint is True:
            found = get_last_checkpoint(self.args.output_dir, save_only_model)
            if found is None:
                raise ValueError(
                    f"resume_from_checkpoint=True, but {self.args.output_dir} holds no complete checkpoint "
                    "(incomplete ones are logged above). Start without resuming, or pass a checkpoint path."
                )
            return found
        return check_resumable(resume_from_checkpoint, save_only_model)

    def _check_setup(self, checkpoint: str) -> SetupChange | None:
        """Compare the checkpoint's setup with this run's: silent, one info line, one warning, or an error."""
        check_same_model(checkpoint, self.model)
        change = compare_setup(checkpoint, self.ipu_config.copy().train(), self.args.per_device_train_batch_size)
        if change is None:
            return None
        if change.layout:
            logger.info("Resuming from %s with a different layout (%s); the weights do not depend on the layout.",
                        checkpoint, change.describe(change.layout))  # fmt: skip
        if not change.batch:
            return change
        if not getattr(self.args, "allow_batch_change_on_resume", False):
            raise ValueError(
                f"Cannot resume from {checkpoint} unchanged: the batch arithmetic differs "
                f"({change.describe(change.batch)}), so a step no longer means the same number of samples. "
                f"Resume with the checkpoint's values, or pass {ACCEPT_BATCH_CHANGE_FLAG} to continue from the "
                f"same number of samples ({change.samples_seen}) with the new combined batch {change.combined_batch}."
            )
        logger.warning("%s.", change.batch_message())
        return change

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial):
        """The Trainer's state restore, with the step counted in samples when the combined batch changed.

        transformers compares `per_device_train_batch_size` with the state's `train_batch_size`, which
        here is the combined batch, and would warn on every resume; `_check_setup` has compared the
        real batch arithmetic already, so that comparison is given matching values.
        """
        change = self._resume_change if resume_from_checkpoint is not None else None
        saved_batch = None
        if resume_from_checkpoint is not None:
            saved = json.loads((Path(resume_from_checkpoint) / TRAINER_STATE).read_text()).get("train_batch_size")
            saved_batch = saved // max(1, self.args.n_gpu) if saved else None
        with contextlib.ExitStack() as stack:
            if saved_batch:
                stack.enter_context(_instance_override(self.args, "per_device_train_batch_size", saved_batch))
            result = super()._init_training_state(
                max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
            )
        if not (isinstance(result, tuple) and len(result) == 2):
            raise RuntimeError("transformers' Trainer._init_training_state no longer returns (epochs, steps); "
                               "optimum_ipu.checkpoints needs an update for this transformers version.")
        if change is None or not change.batch:
            return result
        step = change.resumed_step
        self.state.global_step = step
        self.state.train_batch_size = change.combined_batch
        skipped = 0 if self.args.ignore_data_skip else step % num_update_steps_per_epoch
        return step // num_update_steps_per_epoch, skipped

    def _load_optimizer_and_scheduler(self, checkpoint) -> None:
        """Load as transformers does; after a batch change, move the LR schedule to the resumed step."""
        super()._load_optimizer_and_scheduler(checkpoint)
        change = self._resume_change
        if checkpoint is None or change is None or not change.batch or self.lr_scheduler is None:
            return
        scheduler = getattr(self.lr_scheduler, "scheduler", self.lr_scheduler)  # accelerate may wrap it
        scheduler.last_epoch = change.resumed_step - 1
        with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": intended here
            warnings.simplefilter("ignore")
            scheduler.step()
