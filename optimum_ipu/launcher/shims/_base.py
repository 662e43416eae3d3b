"""What a shim is: a named, documented stand-in for an API that transformers v5 or datasets 3 removed.

Each shim says what it replaces and by what (the docs page and the run's notes quote these strings)
and installs itself through `Patches`. `install` returns `None` when the shim is in place, or a
`Skip`: the installed library still has the API (nothing to do), or the shim does not fit the
installed version (the launcher says so in one line, with the way out).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from optimum_ipu.launcher.shims._patch import Patches

__all__ = ["Shim", "Skip"]


@dataclass(frozen=True)
class Skip:
    """Why a shim was not installed; `problem` is False when the API is simply still there."""

    reason: str
    problem: bool = False


@dataclass(frozen=True)
class Shim:
    """A compatibility shim of `optimum-ipu run`.

    Attributes:
        name: short key, used in notes and the docs (e.g. ``"send_example_telemetry"``).
        replaces: the removed API, as a user would recognise it in their script.
        by: what runs instead, in a sentence.
        install: puts the shim in place; returns `None` when installed, or a `Skip`.
        notebooks_only: installed for notebooks only (interactive helpers a script never calls).
    """

    name: str
    replaces: str
    by: str
    install: Callable[[Patches], Skip | None]
    notebooks_only: bool = False
