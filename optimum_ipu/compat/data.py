"""`pad_on_batch_axis`: fixed-size batches for a data collator, by repeating samples."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["pad_on_batch_axis"]


def _pad(value: Any, batch_size: int) -> Any:
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] in (0, batch_size):
        return value
    rows = torch.arange(batch_size, device=value.device) % value.shape[0]
    return value.index_select(0, rows)


def pad_on_batch_axis(batch_size: int) -> Callable[[Callable[..., dict]], Callable[..., dict]]:
    """Wrap a data collator so every batch it returns has `batch_size` rows.

    A short batch (the last of an epoch) is filled by repeating its samples from the first one, and a
    longer one is cut to `batch_size`, so that a compiled IPU program always sees one batch shape. In
    `IPUTrainer` the same padding is `IPUTrainingArguments(pad_on_batch_axis=True)`, which also trims
    the predictions of the repeated samples back; this wrapper is for loops of your own.

    Args:
        batch_size: the number of rows of every batch.

    Returns:
        A decorator: `pad_on_batch_axis(8)(collator)` is the padded collator.
    """
    if batch_size < 1:
        raise ValueError(f"pad_on_batch_axis needs a batch_size >= 1, got {batch_size}.")

    def decorate(collator: Callable[..., dict]) -> Callable[..., dict]:
        @functools.wraps(collator)
        def padded(*args, **kwargs) -> dict:
            batch = collator(*args, **kwargs)
            for key in list(batch.keys()):
                batch[key] = _pad(batch[key], batch_size)
            return batch

        return padded

    return decorate
