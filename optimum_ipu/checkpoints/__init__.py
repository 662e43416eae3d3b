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
- **One run per output folder.** The process that writes a run's checkpoints holds a lock on its
  `output_dir` while it trains (`run_lock.output_dir_lock`, taken in `AtomicCheckpoints.train`): a second
  run started there is refused before its first step, naming the run that holds it; the lock of a run
  that crashed is released by the operating system and taken over with one warning.
- **Complete means loadable.** `checkpoint_problems` is the one definition: the trainer state (a
  JSON object with numbers where numbers belong), the weights (a well-formed header, not truncated),
  and, unless `save_only_model`, the optimizer and scheduler. `get_last_checkpoint` (exported as
  `optimum_ipu.get_last_checkpoint`) and `train(resume_from_checkpoint=True)` skip folders that fail
  it, saying which and why; when none is complete, resuming is one error naming each folder and why.
- **A changed setup is named.** `compare_setup` diffs the checkpoint's `ipu_config.json` and batch
  size against the current run: a layout-only change is one info line (weights do not depend on the
  layout); a change of the batch arithmetic is an error naming each field and the flag that accepts
  it (`--allow_batch_change_on_resume`), with which the run continues from the same number of samples.

Only `trainer_hooks.py` touches private `Trainer` methods (`_save_checkpoint`, `_save`, `_get_output_dir`,
`_init_training_state`, `_load_optimizer_and_scheduler`); `tests/test_checkpoints.py` pins the
transformers contract they rely on, and the code raises instead of guessing when it changes.
"""

from optimum_ipu.checkpoints.folders import (
    CHECKPOINT_RE,
    STAGING_PREFIX,
    checkpoint_problems,
    get_last_checkpoint,
    is_complete_checkpoint,
    staging_folder,
)
from optimum_ipu.checkpoints.setup_change import SetupChange, compare_setup
from optimum_ipu.checkpoints.trainer_hooks import AtomicCheckpoints

__all__ = [
    "AtomicCheckpoints",
    "CHECKPOINT_RE",
    "STAGING_PREFIX",
    "SetupChange",
    "checkpoint_problems",
    "compare_setup",
    "get_last_checkpoint",
    "is_complete_checkpoint",
    "staging_folder",
]
