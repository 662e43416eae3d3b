"""What a dataset that fails while loading ahead raises: PopTorch's errors for its data worker.

PopTorch loads an asynchronous `DataLoader` (and `AsynchronousDataAccessor`) in one worker process.
When the dataset raises there before the first item is ready, the worker never finishes starting and
PopTorch raises `poptorch.Error("AsynchronousDataAccessor worker thread failed to start (Check above
for details)")`; when it raises later, the dead worker is found by an assertion, "An error occurred in
the data fetcher". Here torch's own workers (or the accessor's thread) load ahead and re-raise the
dataset's exception in this process; `worker_failures` turns it into PopTorch's error for that moment,
keeping the dataset's exception as the cause (its traceback is printed above the error), so a program
that catches `poptorch.Error` around its data loop catches it here too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from optimum_ipu.poptorch._logging import Error

__all__ = ["DataFetcherError", "worker_failures"]

FAILED_TO_START = "AsynchronousDataAccessor worker thread failed to start (Check above for details)"
FETCHER_FAILED = "An error occurred in the data fetcher"

_FIX = (
    "Fix the dataset's __getitem__ (or __iter__, or the collate_fn) so every sample loads; to debug it in "
    "this process, iterate over a DataLoader with mode=poptorch.DataLoaderMode.Sync and num_workers=0."
)


class DataFetcherError(Error, AssertionError):
    """The dataset failed in the loading worker after its first item: PopTorch finds the dead worker with an
    assertion (an `AssertionError`), so this is one, and a `poptorch.Error` as well."""


def _what_failed(error: BaseException) -> str:
    """The dataset's own exception, as `Type: message` on one line: torch re-raises a worker's exception
    with its traceback in the message ("Caught X in DataLoader worker process 0. Original Traceback ..."),
    which ends with the original exception, the first line there that is not indented."""
    text = str(error)
    if text.startswith("Caught ") and "Original Traceback" in text:
        lines = text.split("Original Traceback", 1)[1].splitlines()[1:]
        first = next((i for i, line in enumerate(lines) if line and not line[0].isspace()), len(lines))
        text = " ".join(line.strip() for line in lines[first:] if line.strip())
        return text[:300] + (" ..." if len(text) > 300 else "")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _worker_error(error: Exception, started: bool, where: str) -> Error:
    what = _what_failed(error)
    if not started:
        return Error(
            f"{FAILED_TO_START}: the dataset raised an exception ({what}) while {where} loaded the first batch. "
            f"{_FIX}"
        )
    return DataFetcherError(
        f"{FETCHER_FAILED}: the dataset raised an exception ({what}) while {where} loaded a batch. {_FIX}"
    )


class worker_failures:  # noqa: N801 - used as a function: it wraps an iterator
    """`items`, with an exception the loading raises turned into PopTorch's error (`where`: who loaded,
    for the message). A `poptorch.Error` (already PopTorch's, e.g. an empty iterable dataset) passes;
    `len()` is the wrapped iterator's."""

    def __init__(self, items: Iterator[Any], where: str):
        self._items, self._where, self._started = items, where, False

    def __iter__(self) -> worker_failures:
        return self

    def __len__(self) -> int:
        return len(self._items)

    def __next__(self) -> Any:
        try:
            item = next(self._items)
        except (StopIteration, Error):
            raise
        except Exception as error:
            raise _worker_error(error, self._started, self._where) from error
        self._started = True
        return item
