"""What a checkpoint folder is: complete or absent, found by number, written atomically.

`checkpoint_problems` is the one definition of complete (the trainer state, the weights not
truncated, and unless `save_only_model` the optimizer and scheduler); `get_last_checkpoint` and
resuming skip folders that fail it. The file operations (`staging_folder`, `flush_tree`, `publish`,
`rotate`) are what `trainer_hooks.AtomicCheckpoints` composes into an atomic save.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import zipfile
from pathlib import Path

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
    other = get_last_checkpoint(Path(path).parent, save_only_model)  # None when the parent is no folder
    hint = (
        f"resume from {other} (the newest complete one) instead"
        if other
        else "start without --resume_from_checkpoint"
    )
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
    old = final.parent / f"{STAGING_PREFIX}{final.name}-replaced"
    shutil.rmtree(old, ignore_errors=True)  # left by a run killed while it replaced this step
    if (
        final.exists()
    ):  # the same step saved again (a resumed run): keep the old one until the new is in place
        os.replace(final, old)
    os.replace(staged, final)
    _fsync(final.parent)
    shutil.rmtree(old, ignore_errors=True)  # one that cannot be deleted now is removed at the next save


def rotate(
    run_dir: str | os.PathLike, save_total_limit: int | None, protected: list[str | None]
) -> list[Path]:
    """Keep the newest `save_total_limit` checkpoints (and the `protected` ones); return those removed.

    A folder is first renamed out of the `checkpoint-N` namespace, then deleted, so a kill during the
    deletion leaves a staging folder (removed at the next save), never a half-deleted checkpoint.
    """
    if save_total_limit is None or save_total_limit <= 0:
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
