"""Reversible attribute patches: every shim changes other libraries only through `Patches`.

The launcher must leave transformers, datasets and evaluate exactly as it found them once a script
has run (tests run scripts in-process, and `import optimum_ipu` must never see a shim). `Patches`
records each attribute it sets, and whether it existed, and `restore()` undoes them in reverse order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["Patches", "wrap_classmethod"]

_ABSENT = object()


class Patches:
    """A stack of attribute changes that `restore()` undoes, newest first."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any, bool]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        """Set `owner.name = value`, remembering the previous value (or that there was none)."""
        previous = (
            owner.__dict__.get(name, _ABSENT) if hasattr(owner, "__dict__") else getattr(owner, name, _ABSENT)
        )
        self._undo.append((owner, name, previous, False))
        setattr(owner, name, value)

    def set_item(self, mapping: dict, key: str, value: Any) -> None:
        """Set `mapping[key] = value` (e.g. a module in `sys.modules`), remembering what was there."""
        self._undo.append((mapping, key, mapping.get(key, _ABSENT), True))
        mapping[key] = value

    def restore(self) -> None:
        """Undo every change, newest first."""
        while self._undo:
            owner, name, previous, is_item = self._undo.pop()
            if is_item:
                if previous is _ABSENT:
                    owner.pop(name, None)
                else:
                    owner[name] = previous
            elif previous is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, previous)


def wrap_classmethod(patches: Patches, owner: type, name: str, adapt: Callable[[dict], None]) -> bool:
    """Replace the classmethod `owner.name` (defined on `owner` itself) by one that first calls
    `adapt(kwargs)` to rewrite its keyword arguments in place. False if `owner` defines no such classmethod."""
    original = owner.__dict__.get(name)
    if not isinstance(original, classmethod):
        return False
    function = original.__func__

    @functools.wraps(function)
    def adapted(cls, *args, **kwargs):
        adapt(kwargs)
        return function(cls, *args, **kwargs)

    patches.set(owner, name, classmethod(adapted))
    return True
