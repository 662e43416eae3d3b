"""How the launcher talks to the user: one note per shim the first time it acts, and one-line errors.

A shim that silently changed a call would hide from the user what their script really ran, and a
note on every call would bury the script's own output. So each note has a key and is printed once
per run, on stderr, prefixed with ``[optimum-ipu run]`` so it cannot be mistaken for the script's
own output. `LauncherError` is the launcher's own failure (a missing file, data or a metric that
needs the network while offline, a package to install): the runner prints its message as one line
instead of a traceback.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["LauncherError", "PREFIX", "note", "note_once", "reset_notes", "run_notes"]

PREFIX = "[optimum-ipu run]"
# The folder of the current run's said notes, inherited by the processes the program starts.
RUN_NOTES_VARIABLE = "OPTIMUM_IPU_RUN_NOTES"

_seen: set[str] = set()


class LauncherError(Exception):
    """A problem the launcher can name in one line, with the way out; printed without a traceback."""


def note(message: str) -> None:
    """Print one launcher note on stderr (flushed, so it lands in order with the script's output)."""
    sys.stdout.flush()
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)


def note_once(key: str, message: str) -> None:
    """Print `message` the first time `key` is seen in this run; later calls are silent.

    "This run" includes the processes the program starts (a DataLoader's workers run its collator and its
    dataset's decoding): during a run, `run_notes()` gives the run a folder, named in the environment the
    workers inherit, and the first process to create a key's marker file there is the one that prints.
    """
    if key in _seen:
        return
    _seen.add(key)
    folder = os.environ.get(RUN_NOTES_VARIABLE)
    if folder:
        marker = os.path.join(folder, hashlib.sha256(key.encode()).hexdigest()[:32])
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # another process of this run has said it
        except OSError:
            pass  # the run's folder is gone (a worker outliving the run): say it here
    note(message)


def reset_notes() -> None:
    """Forget which notes were printed (each run of a script or notebook starts afresh)."""
    _seen.clear()


@contextlib.contextmanager
def run_notes() -> Iterator[None]:
    """One run's notes, said once across the processes it starts; the folder behind it is removed at the end."""
    previous = os.environ.get(RUN_NOTES_VARIABLE)
    folder = tempfile.mkdtemp(prefix="optimum-ipu-run-notes-")
    os.environ[RUN_NOTES_VARIABLE] = folder
    reset_notes()
    try:
        yield
    finally:
        reset_notes()
        if previous is None:
            os.environ.pop(RUN_NOTES_VARIABLE, None)
        else:
            os.environ[RUN_NOTES_VARIABLE] = previous
        shutil.rmtree(folder, ignore_errors=True)
