"""Attributes set for the length of a `with` block, with exactly what was there put back after.

The trainer shows transformers' Trainer other arguments for one call, a pipeline hands its model's
call to the IPU, generation switches the cache, a config reads in another mode: each sets attributes
and must restore them whatever happens, including an attribute that was only the class's (it is
deleted again from the instance, not frozen onto it). This module imports nothing of the package, so
every room may use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["overridden"]

_ABSENT = object()


@contextlib.contextmanager
def overridden(obj: Any, **values: Any) -> Iterator[Any]:
    """Set `values` as attributes of `obj` while the block runs; put back exactly what was there (an
    instance attribute's old value; for one the instance did not hold, its instance copy is deleted, or
    the old value set back where it cannot be, as through a property). Yields `obj`."""
    own = getattr(obj, "__dict__", {})
    saved = {name: (name in own, getattr(obj, name, _ABSENT)) for name in values}
    try:
        for name, value in values.items():
            setattr(obj, name, value)
        yield obj
    finally:
        for name, (held, old) in saved.items():
            if not held and name in getattr(obj, "__dict__", {}):
                delattr(obj, name)  # the class's attribute shows through again
            elif old is not _ABSENT:
                setattr(obj, name, old)
