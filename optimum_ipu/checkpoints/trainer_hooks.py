"""The Trainer side of checkpoints: the private `Trainer` methods this package overrides, in one place.

`AtomicCheckpoints` (a mixin before `transformers.Trainer` in IPUTrainer's bases) overrides
`_save_checkpoint` (write into a staging folder, publish by rename, rotate after), `_save` (the model's
save, inside the trainer's `_model_as_saved`), `train` (hold the output folder's lock, resolve
`resume_from_checkpoint=True` to the newest complete checkpoint and compare its setup),
`_init_training_state` (count the resumed step in samples after a batch change) and
`_load_optimizer_and_scheduler` (move the schedule to that step). `tests/test_checkpoints.py` pins
the transformers contract each relies on, and the code raises instead of guessing when it changes.
The trainer adds its own behaviour through two methods of ours, `_gather_process_state` and
`_model_as_saved`, so that no other class overrides a private `Trainer` method.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import warnings
from pathlib import Path

from optimum_ipu.checkpoints.folders import (
    CHECKPOINT_PREFIX,
    TRAINER_STATE,
    check_resumable,
    find_last_checkpoint,
    publish,
    read_trainer_state,
    remove_leftover_staging,
    rotate,
    staging_folder,
    warn_skipped,
)
from optimum_ipu.checkpoints.run_lock import output_dir_lock
from optimum_ipu.checkpoints.setup_change import (
    ACCEPT_BATCH_CHANGE_FLAG,
    SetupChange,
    check_same_model,
    compare_setup,
)
from optimum_ipu.overrides import overridden

logger = logging.getLogger(__name__)


# -- the Trainer side ---------------------------------------------------------------------------------


class AtomicCheckpoints:
    """Trainer mixin: atomic checkpoints, resuming from the newest complete one, setup comparison.

    Put it before `transformers.Trainer` in the bases (`class IPUTrainer(AtomicCheckpoints, Trainer)`).
    It needs `self.ipu_config` (the effective IPU config) from the trainer.
    """

    _resume_change: SetupChange | None = None

    # -- the trainer's hooks (ours, not transformers'): nothing to do by default ------------------

    def _gather_process_state(self) -> None:
        """Run first by every checkpoint save: a trainer whose processes each hold part of the state (a
        pipeline stage's weights, some replicas' random streams) gives every process all of it here."""

    def _model_as_saved(self, output_dir: str) -> contextlib.AbstractContextManager[None]:
        """Entered around transformers' save of the model into `output_dir`: a trainer that changes the
        model's form (pipelining) puts it back in its plain form here, and may write files beside it."""
        return contextlib.nullcontext()

    # -- saving ---------------------------------------------------------------------------------

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """transformers' save of the model (a checkpoint's, or `save_model`'s), inside `_model_as_saved`."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        with self._model_as_saved(output_dir):
            if state_dict is None and not hasattr(self.model, "save_pretrained"):
                state_dict = _each_tensor_once(self.model.state_dict())
            super()._save(output_dir, state_dict)

    def _save_checkpoint(self, model, trial) -> None:
        """transformers' checkpoint, written into a staging folder and renamed into place last."""
        self._gather_process_state()
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
        with overridden(self, _get_output_dir=lambda trial=None: str(staging)), \
                overridden(args, save_total_limit=None):  # fmt: skip
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
        """Take the output folder's lock, resolve `resume_from_checkpoint` to a complete checkpoint and check
        its setup, then train.

        The lock (`run_lock.output_dir_lock`) is held by the process that writes the checkpoints
        (`args.should_save`) for the whole run, so a second run started in the same `output_dir` is
        refused before it trains, instead of deleting the checkpoint this one is writing.
        """
        output_dir = self.args.output_dir
        holds_lock = self.args.should_save and output_dir is not None
        with output_dir_lock(output_dir) if holds_lock else contextlib.nullcontext():
            checkpoint = self._checkpoint_to_resume(resume_from_checkpoint)
            self._resume_change = self._check_setup(checkpoint) if checkpoint is not None else None
            return super().train(checkpoint, trial, ignore_keys_for_eval, **kwargs)

    def _checkpoint_to_resume(self, resume_from_checkpoint) -> str | None:
        """The complete checkpoint to resume from, None for a fresh start, or an error saying what to do.

        `True` takes the newest complete `checkpoint-N` in `output_dir`, with one warning per newer
        folder skipped (named, with why); when none is complete the error names every folder and why,
        so a corrupt newest checkpoint is never a raw error. A path must itself be complete.
        """
        if resume_from_checkpoint is None or resume_from_checkpoint is False:
            return None
        save_only_model = bool(self.args.save_only_model)
        if resume_from_checkpoint is True:
            out = self.args.output_dir
            found, skipped = find_last_checkpoint(out, save_only_model)
            if found is not None:
                warn_skipped(skipped)
                return found
            if not skipped:
                raise ValueError(
                    f"resume_from_checkpoint=True, but {out} holds no checkpoint (no {CHECKPOINT_PREFIX}-N "
                    "folder). Start without resuming, or pass a checkpoint path."
                )
            listing = "".join(f"\n- {path}: {'; '.join(problems)}" for path, problems in skipped)
            raise ValueError(
                f"resume_from_checkpoint=True, but {out} holds no complete checkpoint:{listing}\n"
                "Start without resuming, pass a checkpoint path, or delete these folders."
            )
        return check_resumable(resume_from_checkpoint, save_only_model)

    def _check_setup(self, checkpoint: str) -> SetupChange | None:
        """Compare the checkpoint's setup with this run's: silent, one info line, one warning, or an error."""
        check_same_model(checkpoint, self.model)
        change = compare_setup(
            checkpoint, self.ipu_config.copy().train(), self.args.per_device_train_batch_size
        )
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

    def _init_training_state(
        self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
    ):
        """The Trainer's state restore, with the step counted in samples when the combined batch changed.

        transformers compares `per_device_train_batch_size` with the state's `train_batch_size`, which
        here is the combined batch, and would warn on every resume; `_check_setup` has compared the
        real batch arithmetic already, so that comparison is given matching values.
        """
        change = self._resume_change if resume_from_checkpoint is not None else None
        with contextlib.ExitStack() as stack:
            if resume_from_checkpoint is not None:
                saved = read_trainer_state(resume_from_checkpoint).get("train_batch_size")
                if saved:  # divided over GPUs as transformers' comparison divides it
                    per_device = saved // max(1, self.args.n_gpu)
                    stack.enter_context(
                        overridden(self.args, per_device_train_batch_size=per_device)
                    )
            result = super()._init_training_state(
                max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
            )
        if not (isinstance(result, tuple) and len(result) == 2):
            raise RuntimeError(
                "transformers' Trainer._init_training_state no longer returns (epochs, steps); "
                "optimum_ipu.checkpoints needs an update for this transformers version."
            )
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


def _each_tensor_once(state_dict: dict) -> dict:
    """`state_dict` with each shared tensor under its first name only.

    transformers saves a model that is not a `PreTrainedModel` (a user's own `nn.Module`, as in Optimum
    Graphcore's external_model notebook) with safetensors' `save_file`, which refuses tensors that share
    memory: a head tied to the word embedding failed every checkpoint. Its weight is saved once, as
    safetensors' `save_model` does; loading the state dict with `strict=False` (transformers' resume
    does) fills the tied copy through the tie.
    """
    kept: dict = {}
    seen: dict[tuple, str] = {}
    for name, tensor in state_dict.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.dtype)
        if key in seen and tensor.untyped_storage().nbytes():
            logger.info("%s shares its memory with %s: saved once, under %s.", name, seen[key], seen[key])
            continue
        seen.setdefault(key, name)
        kept[name] = tensor
    return kept
