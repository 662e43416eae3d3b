"""Whether matplotlib, an optional dependency (`optimum-ipu[plots]`), can draw: checked without importing it,
so a command can refuse a drawing before its work and stay light when none is asked for."""

from __future__ import annotations

import importlib.util


def require_matplotlib(drawing: str) -> None:
    """An ImportError naming the fix when matplotlib is missing; `drawing` says what it was needed for."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ImportError(f"Drawing {drawing} needs matplotlib: pip install 'optimum-ipu[plots]' (the JSON report does not).")
