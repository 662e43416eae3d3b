"""Saying a thing once per process: a setting with no effect here, a fallback taken, an old name read as the new.

A user's script meets such a case at every call (a trainer per run, a pipeline per prompt); the house rule
is that it is said, and said once. The messages said so far are one set for the whole package, so every
room says them the same way; `forget()` empties it (tests that count what is said).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

__all__ = ["forget", "warn_once"]

_SAID: set[Hashable] = set()


def warn_once(logger: logging.Logger, message: str, *args: object, key: Hashable | None = None) -> bool:
    """Log `message % args` as a warning on `logger` the first time it (or `key`, when given) comes here.

    Returns whether it was said now.
    """
    seen = (logger.name, message % args if args else message) if key is None else (logger.name, key)
    if seen in _SAID:
        return False
    _SAID.add(seen)
    logger.warning(message, *args)
    return True


def forget() -> None:
    """Say everything again from now on (for tests that count the warnings of one run)."""
    _SAID.clear()
