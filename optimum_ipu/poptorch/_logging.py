"""PopTorch's errors and logging: `poptorch.Error`, `setLogLevel`, and "no effect here" notes said once."""

from __future__ import annotations

import logging
import os

__all__ = [
    "Error", "RecoverableError", "UnrecoverableError", "logger", "no_effect", "note_poplar_engine_options",
    "setLogLevel",
]  # fmt: skip

logger = logging.getLogger("poptorch")

_LEVELS = {"TRACE": 5, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "ERR": logging.ERROR, "OFF": logging.CRITICAL + 10}  # fmt: skip


class Error(RuntimeError):
    """An error PopTorch raises (compile or run time). `message`, `type` and `location` as PopTorch has them."""

    def __init__(self, message: str, type: str = "poptorch_py_error", location: str = ""):  # noqa: A002
        super().__init__(message)
        self.message = message
        self.type = type
        self.location = location


class RecoverableError(Error):
    """A device fault PopTorch can recover from (never raised by the simulated IPU, which has no faults)."""

    recovery_action = "IPU_RESET"


class UnrecoverableError(Error):
    """A device fault PopTorch cannot recover from (never raised here)."""


def setLogLevel(level: str | int) -> None:
    """Set the `poptorch` logger's level: TRACE, DEBUG, INFO, WARN, ERR, OFF or a `logging` level number."""
    if isinstance(level, str):
        if level.upper() not in _LEVELS:
            raise ValueError(
                f"Unknown log level {level!r}: use one of {', '.join(_LEVELS)} or a logging level number."
            )
        level = _LEVELS[level.upper()]
    logger.setLevel(level)


_said: set[str] = set()


def no_effect(name: str, why: str) -> None:
    """Log once per process that option or call `name` is accepted but changes nothing here, and why."""
    if name in _said:
        return
    _said.add(name)
    logger.warning("%s has no effect on the simulated IPU: %s", name, why)


def note_poplar_engine_options() -> None:
    """Say once that `POPLAR_ENGINE_OPTIONS` (Poplar reads it when it builds an engine: PopVision's
    `autoReport.*`, as Lightning's `IPUStrategy(autoreport=True)` sets it) changes nothing here."""
    if os.environ.get("POPLAR_ENGINE_OPTIONS"):
        no_effect(
            "POPLAR_ENGINE_OPTIONS",
            "no Poplar engine runs, so no PopVision report (autoReport) is written; the compile report "
            "(model.compile_result.report, logged on optimum_ipu.compiling) is the estimate here.",
        )
