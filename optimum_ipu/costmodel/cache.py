"""A disk cache of traced profiles, so pricing a model again needs neither torch nor transformers.

Tracing is fast (a fraction of a second), but importing torch and a transformers model class takes
seconds. A `ModelProfile` is plain data, so `optimum-ipu plan` stores it as JSON under a key made
of everything the trace depends on: the model's config, its task class, the micro-batch shapes, the
mode and precision, the versions of torch, transformers and optimum-ipu, and the tracer's own
source. Any change there is a new key; a stale entry is never read.

The folder is `$OPTIMUM_IPU_CACHE/profiles`, else `$XDG_CACHE_HOME/optimum-ipu/profiles`, else
`~/.cache/optimum-ipu/profiles`. Entries are small (tens of KB) and safe to delete.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from optimum_ipu._cache_folder import cache_root
from optimum_ipu.costmodel.profile import ModelProfile

PROFILE_FORMAT = 1
T = TypeVar("T")
_TRACER_SOURCES = ("trace.py", "profile.py", "presets.py")  # presets.py builds the traced models


def cache_dir() -> Path:
    """Folder holding cached profiles (not created until something is stored)."""
    return cache_root() / "profiles"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def profile_key(**parts: Any) -> str:
    """A hex digest of `parts` (JSON-able) plus the versions and tracer source the trace depends on."""
    here = Path(__file__).parent
    tracer = hashlib.sha256(b"".join((here / name).read_bytes() for name in _TRACER_SOURCES)).hexdigest()
    stamp = {
        "format": PROFILE_FORMAT,
        "tracer": tracer,
        "versions": {p: _version(p) for p in ("torch", "transformers", "optimum-ipu")},
        "parts": parts,
    }
    return hashlib.sha256(json.dumps(stamp, sort_keys=True, default=str).encode()).hexdigest()[:32]


def load_profile(key: str, folder: str | os.PathLike | None = None) -> ModelProfile | None:
    """The cached profile for `key` (in `folder`, default `cache_dir()`), or None when missing or unreadable."""
    return load_entry(key, ModelProfile.from_dict, folder)


def save_profile(key: str, profile: ModelProfile, folder: str | os.PathLike | None = None) -> Path | None:
    """Store `profile` under `key` (in `folder`, default `cache_dir()`); None when it is not writable."""
    return save_entry(key, profile.to_dict(), folder)


def load_entry(key: str, read: Callable[[Any], T], folder: str | os.PathLike | None = None) -> T | None:
    """`read` of the JSON cached under `key`, or None when missing or unreadable (any traced data:
    a profile, the programs of a generation)."""
    path = Path(folder or cache_dir()) / f"{key}.json"
    try:
        return read(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def save_entry(key: str, data: Any, folder: str | os.PathLike | None = None) -> Path | None:
    """Store the JSON-able `data` under `key`; None when the folder is not writable."""
    folder = Path(folder or cache_dir())
    path = folder / f"{key}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(data))
        partial.replace(path)  # atomic: a concurrent reader sees the old entry or the new one
    except OSError:
        return None
    return path
