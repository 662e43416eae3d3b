"""What a checkpoint folder is: complete or absent, found by number, written atomically.

`checkpoint_problems` is the one definition of complete (the trainer state, the weights not
truncated, and unless `save_only_model` the optimizer and scheduler); `get_last_checkpoint` and
resuming skip folders that fail it. It never raises: a file of the wrong shape (a safetensors header
that is a list, a tensor without `data_offsets`, `"global_step": "ten"`) is one more named problem,
so a corrupt newest folder is skipped with a warning, not fatal. The readers of those files
(`safetensors_shapes`, `read_trainer_state`) check the same shapes and raise a `ValueError` naming
the folder, the file, what is wrong and what to do. The file operations (`staging_folder`,
`flush_tree`, `publish`, `rotate`) are what `trainer_hooks.AtomicCheckpoints` composes into an
atomic save.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

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

# trainer_state.json's number fields (those of transformers' `TrainerState`): name -> (kind, may be null).
# "count" fields are whole numbers >= 0 (resuming computes with them: the step, the combined batch);
# "number" fields may be any JSON number. A string there ("global_step": "ten") would fail later,
# inside transformers or the setup comparison, with a raw TypeError or ValueError.
STATE_NUMBERS: dict[str, tuple[str, bool]] = {
    "global_step": ("count", False),
    "train_batch_size": ("count", True),
    "epoch": ("number", True),  # null in states of older transformers versions
    "max_steps": ("number", False),
    "logging_steps": ("number", False),
    "eval_steps": ("number", False),
    "save_steps": ("number", False),
    "num_train_epochs": ("number", False),
    "num_input_tokens_seen": ("number", False),
    "total_flos": ("number", False),
    "best_metric": ("number", True),
    "best_global_step": ("number", True),
}


def json_kind(value: Any) -> str:
    """What a JSON value is, in words ("a list"), for messages about a file of the wrong shape."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), type(value).__name__)


def _shown(value: Any, limit: int = 60) -> str:
    """A JSON value as the file spells it, cut to `limit` characters, for naming a wrong value."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def unusable(folder: str | os.PathLike, problem: str) -> ValueError:
    """The error for a checkpoint file that cannot be used: the folder, the problem, what to do."""
    return ValueError(
        f"Cannot resume from {folder}: {problem}. Resume from another checkpoint "
        "(resume_from_checkpoint=True takes the newest complete one), or delete the folder."
    )


def _header_shape_problem(header: Any) -> str | None:
    """Why a parsed safetensors header is not what the safetensors library loads, or None.

    The library wants an object of tensor name -> {dtype: string, shape: [counts], data_offsets:
    [begin, end]}, plus an optional `__metadata__` object of strings (or null); other keys in an entry
    are ignored by it and here. Checked here so that readers of the header never index into a value of
    the wrong type.
    """
    if not isinstance(header, dict):
        return f"the header is {json_kind(header)}, not a JSON object"
    for name, entry in header.items():
        if name == "__metadata__":
            if entry is not None and not (
                isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values())
            ):
                return f"__metadata__ is {json_kind(entry)}, not an object of strings"
            continue
        if not isinstance(entry, dict):
            return f"tensor {name!r} is {json_kind(entry)}, not an object"
        for key in ("dtype", "shape", "data_offsets"):
            if key not in entry:
                return f"tensor {name!r} has no {key}"
        if not isinstance(entry["dtype"], str):
            return f"tensor {name!r} has dtype {_shown(entry['dtype'])}, not a string"
        shape = entry["shape"]
        if not (isinstance(shape, list) and all(_is_count(n) for n in shape)):
            return f"tensor {name!r} has shape {_shown(shape)}, not a list of whole numbers >= 0"
        offsets = entry["data_offsets"]
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(_is_count(n) for n in offsets)
            and offsets[0] <= offsets[1]
        ):
            return (
                f"tensor {name!r} has data_offsets {_shown(offsets)}, "
                "not [begin, end] (whole numbers, begin <= end)"
            )
    return None


def _read_safetensors_header(path: Path) -> tuple[dict[str, Any], str | None]:
    """A safetensors file's header and why the file cannot load ({} and the reason when it cannot).

    Reads the header only. Every failure (unreadable, truncated, not JSON, JSON of the wrong shape)
    is a reason naming the file, never an exception, so that one bad file cannot stop the search for
    the newest complete checkpoint.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            header_size = int.from_bytes(handle.read(8), "little")
            if size < 8 or 8 + header_size > size:
                return {}, f"{path.name} is truncated ({size} bytes, shorter than its own header)"
            header = json.loads(handle.read(header_size))
    except (OSError, ValueError, RecursionError) as error:
        return {}, f"{path.name} has no readable safetensors header ({error})"
    shape_problem = _header_shape_problem(header)
    if shape_problem:
        return {}, f"{path.name} has a malformed safetensors header ({shape_problem})"
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    needed = 8 + header_size + max(ends, default=0)
    if size < needed:
        return {}, f"{path.name} is truncated ({size} of {needed} bytes)"
    return header, None


def _safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file cannot load (truncated, bad header), or None; reads the header only."""
    return _read_safetensors_header(path)[1]


def safetensors_shapes(path: str | os.PathLike) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors header, without reading the tensors.

    A file that cannot load (truncated, a header that is not JSON or of the wrong shape) is a
    `ValueError` naming its folder, the file and what to do, not a raw `KeyError` from the header.
    """
    path = Path(path)
    header, problem = _read_safetensors_header(path)
    if problem:
        raise unusable(path.parent, problem)
    return {key: entry["shape"] for key, entry in header.items() if key != "__metadata__"}


def _state_problem(state: Any) -> str | None:
    """Why a parsed `trainer_state.json` is of the wrong shape (not an object, a string for a number), or None."""
    if not isinstance(state, dict):
        return f"{TRAINER_STATE} is {json_kind(state)}, not a JSON object"
    for name, (kind, may_be_null) in STATE_NUMBERS.items():
        if name not in state or (state[name] is None and may_be_null):
            continue
        value = state[name]
        if not (_is_count(value) if kind == "count" else _is_number(value)):
            wanted = "a whole number >= 0" if kind == "count" else "a number"
            return (
                f"{TRAINER_STATE} has {name} {_shown(value)}, not {wanted}{' or null' if may_be_null else ''}"
            )
    return None


def _read_trainer_state(folder: Path) -> tuple[dict[str, Any], str | None]:
    """A checkpoint's `trainer_state.json` and why it cannot be used ({} and the reason when it cannot)."""
    path = folder / TRAINER_STATE
    if not path.is_file():
        return {}, f"no {TRAINER_STATE}"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as error:
        return {}, f"{TRAINER_STATE} is not valid JSON ({error})"
    problem = _state_problem(state)
    return ({}, problem) if problem else (state, None)


def read_trainer_state(folder: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint's `trainer_state.json`, checked to be an object whose number fields are numbers.

    A file that is missing, not JSON, not an object, or has a string where a number belongs is a
    `ValueError` naming the folder, the file and what to do. A missing `global_step` is allowed here
    (it reads as step 0); `checkpoint_problems` is what requires one.
    """
    state, problem = _read_trainer_state(Path(folder))
    if problem:
        raise unusable(folder, problem)
    return state


def checkpoint_problems(path: str | os.PathLike, save_only_model: bool = False) -> list[str]:
    """Why `path` is not a complete checkpoint; an empty list when it is one.

    Complete means what resuming needs: `trainer_state.json`, a JSON object with a `global_step` and
    numbers in its number fields, the model weights (a safetensors file must have a well-formed
    header and hold every byte it describes), and, unless `save_only_model`, `optimizer.pt` and
    `scheduler.pt` (readable torch files). Only headers are read, so checking a large checkpoint is
    cheap, and nothing is written. It never raises: a file or folder that cannot be read is a problem
    (`cannot be read: ...`), so a corrupt folder is skipped, not fatal, when looking for the newest one.
    """
    path = Path(path)
    try:
        return _problems(path, save_only_model)
    except OSError as error:
        return [f"cannot be read: {error}"]


def _problems(path: Path, save_only_model: bool) -> list[str]:
    if not path.is_dir():
        return [f"{path} is not a folder"]
    problems = []
    state, problem = _read_trainer_state(path)
    if problem:
        problems.append(problem)
    elif "global_step" not in state:
        problems.append(f"{TRAINER_STATE} has no global_step")
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
        # The random states transformers restores (one file, or one per process): optional, but a damaged one
        # would stop the resume inside transformers with an error that names no file.
        for file in sorted(path.glob("rng_state*.pth")):
            if not zipfile.is_zipfile(file):
                problems.append(f"{file.name} is truncated or not a torch file")
    # The configs the resume reads (the model's, the IPU config): optional, but they must be JSON when present.
    for name in ("config.json", "ipu_config.json"):
        file = path / name
        if file.is_file():
            try:
                json.loads(file.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                problems.append(f"{name} is not valid JSON ({error.__class__.__name__}: {error})")
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


def find_last_checkpoint(
    folder: str | os.PathLike, save_only_model: bool = False
) -> tuple[str | None, list[tuple[Path, list[str]]]]:
    """The newest complete `checkpoint-N` in `folder` (or None), and the newer folders skipped, with why.

    Logs nothing, so that each caller says it once: `get_last_checkpoint` warns per skipped folder,
    resuming warns or, when nothing is complete (then every `checkpoint-N` folder is in the list),
    raises one error naming them all.
    """
    folder = Path(folder)
    skipped: list[tuple[Path, list[str]]] = []
    if not folder.is_dir():
        return None, skipped
    for _, path in _numbered_checkpoints(folder):
        problems = checkpoint_problems(path, save_only_model)
        if not problems:
            return str(path), skipped
        skipped.append((path, problems))
    return None, skipped


def warn_skipped(skipped: list[tuple[Path, list[str]]]) -> None:
    """One warning per checkpoint folder passed over for being incomplete, naming it and why."""
    for path, problems in skipped:
        logger.warning("Skipping %s: not a complete checkpoint (%s).", path, "; ".join(problems))


def get_last_checkpoint(folder: str | os.PathLike, save_only_model: bool = False) -> str | None:
    """The newest complete `checkpoint-N` in `folder`, or None; incomplete ones are skipped and logged.

    A drop-in for `transformers.trainer_utils.get_last_checkpoint`, which takes any folder with that
    name, including one left half-written by a killed run (or by an older version of this package).
    A corrupt folder (a malformed header, a string where a number belongs) is skipped the same way,
    with one warning naming it and why; nothing raises for what a folder holds.
    """
    found, skipped = find_last_checkpoint(folder, save_only_model)
    warn_skipped(skipped)
    return found


def check_resumable(path: str | os.PathLike, save_only_model: bool = False) -> str:
    """`path` if it is a complete checkpoint, else a `FileNotFoundError` naming what is missing and what to do."""
    problems = checkpoint_problems(path, save_only_model)
    if not problems:
        return str(path)
    other, _ = find_last_checkpoint(Path(path).parent, save_only_model)  # None when the parent is no folder
    hint = (
        f"resume from {other} (the newest complete one) instead"
        if other
        else "start without --resume_from_checkpoint"
    )
    if not Path(path).exists():  # never written (a shorter run, a step that was not saved), not half-written
        raise FileNotFoundError(f"Cannot resume from {path}: there is no such folder; {hint}.")
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
