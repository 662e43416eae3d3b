"""How the launcher talks to the user: one note per shim the first time it acts, and one-line errors.

A shim that silently changed a call would hide from the user what their script really ran, and a
note on every call would bury the script's own output. So each note has a key and is printed once
per run, on stderr, prefixed with ``[optimum-ipu run]`` so it cannot be mistaken for the script's
own output. `LauncherError` is the launcher's own failure (a missing file, data or a metric that
needs the network while offline, a package to install): the runner prints its message as one line
instead of a traceback.
"""

from __future__ import annotations

import sys

__all__ = ["LauncherError", "PREFIX", "note", "note_once", "reset_notes"]

PREFIX = "[optimum-ipu run]"

_seen: set[str] = set()


class LauncherError(Exception):
    """A problem the launcher can name in one line, with the way out; printed without a traceback."""


def note(message: str) -> None:
    """Print one launcher note on stderr (flushed, so it lands in order with the script's output)."""
    sys.stdout.flush()
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)


def note_once(key: str, message: str) -> None:
    """Print `message` the first time `key` is seen in this run; later calls are silent."""
    if key in _seen:
        return
    _seen.add(key)
    note(message)


def reset_notes() -> None:
    """Forget which notes were printed (each run of a script or notebook starts afresh)."""
    _seen.clear()
