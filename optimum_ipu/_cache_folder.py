"""Where optimum-ipu keeps what it makes once and reads again: `$OPTIMUM_IPU_CACHE`, else
`$XDG_CACHE_HOME/optimum-ipu`, else `~/.cache/optimum-ipu`. Each user of it has a subfolder (the cost
model's traced profiles, the runtime's compiled rounding kernel); everything there is safe to delete."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """The cache folder (not created here)."""
    root = os.environ.get("OPTIMUM_IPU_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "optimum-ipu"
