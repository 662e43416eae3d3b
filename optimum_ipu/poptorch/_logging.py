"""PopTorch's errors and logging: `poptorch.Error`, `setLogLevel`, and "no effect here" notes said once."""

from __future__ import annotations

import logging
import os
import sys
import time

from optimum_ipu._once import warn_once

__all__ = [
    "Error", "RecoverableError", "UnrecoverableError", "logger", "no_effect", "note_poplar_engine_options",
    "setLogLevel",
]  # fmt: skip

logger = logging.getLogger("poptorch")

# PopTorch's levels: the names, and the integers of its C++ logger (its "legacy" integer levels).
_LEVELS = {"TRACE": logging.DEBUG, "TRACE_ALL": logging.DEBUG, "DEBUG": logging.DEBUG, "DEBUG_IR": logging.DEBUG,
           "INFO": logging.INFO, "WARN": logging.WARNING, "ERR": logging.ERROR, "OFF": logging.CRITICAL}  # fmt: skip
_LEGACY_LEVELS = {0: "TRACE", 1: "DEBUG", 2: "INFO", 3: "WARN", 4: "ERR", 6: "OFF"}


class _Console(logging.StreamHandler):
    """PopTorch's console handler: every record the logger lets through, to standard error, as
    "[12:34:56.789] [poptorch] [info] message". The stream is looked up at each record, so a redirected
    `sys.stderr` (a notebook's, a test's) gets it."""

    def __init__(self):
        super().__init__()
        self.setFormatter(_Format("[%(asctime)s] [%(name)s] [%(levelname)s] %(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler sets it at creation: the property reads sys.stderr instead
        pass


class _Format(logging.Formatter):
    def formatTime(self, record, datefmt=None):  # noqa: N802 (logging's name)
        return time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"

    def format(self, record):
        record = logging.makeLogRecord({**record.__dict__, "levelname": record.levelname.lower()})
        return super().format(record)


logger.addHandler(_Console())

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
    """Set the `poptorch` logger's level: TRACE, DEBUG, INFO, WARN, ERR or OFF, or PopTorch's integer for
    one of them (0 trace, 1 debug, 2 info, 3 warn, 4 err, 6 off)."""
    if isinstance(level, int):
        if level not in _LEGACY_LEVELS:
            raise ValueError(
                f"Invalid log level integer {level}: PopTorch's are 0 (TRACE), 1 (DEBUG), 2 (INFO), 3 (WARN), "
                "4 (ERR) and 6 (OFF); or give the name."
            )
        level = _LEGACY_LEVELS[level]
    if not isinstance(level, str) or level.upper() not in _LEVELS:
        raise ValueError(f"Unknown log level {level!r}: use one of {', '.join(_LEVELS)}.")
    logger.setLevel(_LEVELS[level.upper()])


# PopTorch reads its level from the environment when it is imported (WARN by default).
try:
    setLogLevel(os.environ.get("POPTORCH_LOG_LEVEL", "WARN"))
except ValueError as error:
    raise ValueError(f"POPTORCH_LOG_LEVEL: {error}") from None


def no_effect(name: str, why: str) -> None:
    """Log once per process that option or call `name` is accepted but changes nothing here, and why."""
    warn_once(logger, "%s has no effect on the simulated IPU: %s", name, why, key=("no effect", name))


def note_poplar_engine_options() -> None:
    """Say once that `POPLAR_ENGINE_OPTIONS` (Poplar reads it when it builds an engine: PopVision's
    `autoReport.*`, as Lightning's `IPUStrategy(autoreport=True)` sets it) changes nothing here."""
    if os.environ.get("POPLAR_ENGINE_OPTIONS"):
        no_effect(
            "POPLAR_ENGINE_OPTIONS",
            "no Poplar engine runs, so no PopVision report (autoReport) is written; the compile report "
            "(model.compile_result.report, logged on optimum_ipu.compiling) is the estimate here.",
        )
