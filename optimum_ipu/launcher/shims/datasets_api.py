"""Shim for `datasets.load_dataset`: the removed `task=` and `use_auth_token=` arguments, and offline data.

datasets < 3 applied a *task template* for `load_dataset(..., task="image-classification")`: it kept
the task's columns only, renamed them to the template's names (`image`, `labels`) and dropped the
rest. datasets 3 removed templates and the argument (`load_dataset` then fails on an unknown
keyword). The shim applies the same layout, finding the columns by their feature types (the
`Image` / `Audio` column, the `ClassLabel` column, the text column).

A data set that must come from the Hub while the Hub is offline stops the run with one line naming
the script's own flags for local files (`--train_file`, `--validation_file`, ...).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os

from optimum_ipu.launcher import _context
from optimum_ipu.launcher._report import LauncherError, note_once
from optimum_ipu.launcher.shims._base import Shim, Skip
from optimum_ipu.launcher.shims._patch import Patches
from optimum_ipu.launcher.shims.transformers_api import adapt_use_auth_token

__all__ = ["LOAD_DATASET", "TASK_LAYOUTS", "apply_task_layout"]


def _is(kind: str):
    def check(feature) -> bool:
        import datasets

        if kind == "string":
            return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")
        return isinstance(feature, getattr(datasets, kind))

    return check


# task -> ((column name after the template, feature test, usual source names), ...), as datasets 2's templates
TASK_LAYOUTS = {
    "image-classification": (("image", _is("Image"), ("image", "img")), ("labels", _is("ClassLabel"), ("label", "labels"))),
    "audio-classification": (("audio", _is("Audio"), ("audio",)), ("labels", _is("ClassLabel"), ("label", "labels"))),
    "text-classification": (("text", _is("string"), ("text", "sentence")), ("labels", _is("ClassLabel"), ("label", "labels"))),
    "automatic-speech-recognition": (("audio", _is("Audio"), ("audio",)),
                                     ("transcription", _is("string"), ("transcription", "text", "sentence"))),
}  # fmt: skip


def _pick(features, target: str, test, usual: tuple[str, ...], task: str) -> str:
    candidates = [name for name, feature in features.items() if test(feature)]
    for name in (target, *usual):
        if name in candidates:
            return name
    if len(candidates) == 1:
        return candidates[0]
    raise LauncherError(
        f"load_dataset(task={task!r}): datasets 3 removed task templates and optimum-ipu cannot tell which column is "
        f"the {target!r} column among {list(features)} (candidates: {candidates or 'none'}); remove task= and "
        f"rename the columns in the script (dataset.rename_column(...))."
    )


def apply_task_layout(dataset, task: str):
    """Keep `task`'s columns of `dataset` (a Dataset or DatasetDict), renamed as datasets 2's task template did."""
    if task not in TASK_LAYOUTS:
        raise LauncherError(
            f"load_dataset(task={task!r}): datasets 3 removed task templates and optimum-ipu only re-creates "
            f"{list(TASK_LAYOUTS)}; remove task= and select/rename the columns in the script."
        )
    splits = dataset.values() if hasattr(dataset, "values") else [dataset]
    features = next(iter(splits)).features
    mapping = {
        _pick(features, target, test, usual, task): target for target, test, usual in TASK_LAYOUTS[task]
    }
    dropped = [name for name in features if name not in mapping]
    if dropped:
        dataset = dataset.remove_columns(dropped)
    renames = {source: target for source, target in mapping.items() if source != target}
    if renames:
        dataset = dataset.rename_columns(renames)
    described = ", ".join(f"{s!r} as {t!r}" if s != t else repr(s) for s, t in mapping.items())
    note_once(
        f"task:{task}",
        f"load_dataset(task={task!r}) was removed in datasets 3: applied the task's column layout here (kept "
        f"{described}" + (f"; dropped {dropped}" if dropped else "") + ").",
    )
    return dataset


def _describe_call(path, args) -> str:
    return "load_dataset(" + ", ".join(repr(a) for a in (path, *args) if a is not None) + ")"


def _offline_error(path, args, error: Exception) -> LauncherError:
    offline = any(os.environ.get(v, "") not in ("", "0") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    why = "which is offline here" if offline else "which could not be reached"
    context = _context.current()
    if context.kind == "notebook":
        way_out = "load local files instead, e.g. load_dataset('csv' or 'json', data_files={'train': ..., 'validation': ...})"
    elif context.data_flags:
        way_out = f"give the data as local files with the script's {', '.join(context.data_flags)}"
    else:
        way_out = "give the script local data files, or put the data set in the local datasets cache first"
    return LauncherError(
        f"{_describe_call(path, args)} needs the Hugging Face Hub, {why} ({error}): {way_out}."
    )


def _install_load_dataset(patches: Patches) -> Skip | None:
    datasets = importlib.import_module("datasets")
    original = datasets.load_dataset
    parameters = inspect.signature(original).parameters
    shim_task = "task" not in parameters
    shim_auth = "use_auth_token" not in parameters

    @functools.wraps(original)
    def load_dataset(path, *args, **kwargs):
        if shim_auth:
            adapt_use_auth_token(kwargs, "load_dataset")
        task = kwargs.pop("task", None) if shim_task else None
        try:
            dataset = original(path, *args, **kwargs)
        except ConnectionError as error:
            if os.path.exists(str(path)):
                raise
            raise _offline_error(path, args, error) from None
        return dataset if task is None else apply_task_layout(dataset, task)

    patches.set(datasets, "load_dataset", load_dataset)
    return None


LOAD_DATASET = Shim(
    name="load_dataset(task=...)",
    replaces='`load_dataset(..., task="image-classification")` (task templates, removed in datasets 3)',
    by="the data set loaded without `task=`, then the template's column layout applied: the task's columns kept "
    "(found by feature type) and renamed to `image`/`audio`/`text` and `labels`/`transcription`, the others dropped",
    install=_install_load_dataset,
)
