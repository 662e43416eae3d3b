"""Batches on the way to the simulated IPU: split, cast, pad, move and combine them.

A combined batch is a dict of tensors whose first dimension is laid out [device iteration][replica]
[accumulation step][micro-batch]; these helpers cut it into those pieces and put results back
together. They know nothing of models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def batch_size_of(batch: Mapping[str, Any]) -> int:
    """The first dimension of the batch's first batched tensor."""
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    raise ValueError(f"the batch has no tensor with a batch dimension (keys: {sorted(batch)}).")


def split_batch(batch: Mapping[str, Any], parts: int) -> list[dict[str, Any]]:
    """Split every tensor of `batch` into `parts` equal chunks along dim 0 (other values are shared)."""
    chunks: list[dict[str, Any]] = [{} for _ in range(parts)]
    for key, value in batch.items():
        pieces = (
            value.chunk(parts, dim=0)
            if isinstance(value, torch.Tensor) and value.dim() > 0
            else [value] * parts
        )
        for chunk, piece in zip(chunks, pieces):
            chunk[key] = piece
    return chunks


def slice_batch(batch: Mapping[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Rows `start:stop` of every batched tensor (other values are shared)."""
    return {k: v[start:stop] if isinstance(v, torch.Tensor) and v.dim() > 0 else v for k, v in batch.items()}


def cast_floating(batch: Mapping[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """Cast floating tensors (pixel values, float labels) to the model's dtype; leave ids alone."""
    return {
        k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != dtype else v
        for k, v in batch.items()
    }


def pad_by_repeating(batch: Mapping[str, Any], size: int) -> dict[str, Any]:
    """Pad every batched tensor to `size` rows by repeating samples (`pad_on_batch_axis`)."""
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] < size:
            index = torch.arange(size, device=value.device) % value.shape[0]
            value = value.index_select(0, index)
        out[key] = value
    return out


def move_to(value: Any, device: torch.device | str) -> Any:
    """`value` (a tensor, or nested tuples, lists and dicts of them) on `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, tuple):
        return tuple(move_to(v, device) for v in value)
    if isinstance(value, list):
        return [move_to(v, device) for v in value]
    if isinstance(value, dict):
        return {k: move_to(v, device) for k, v in value.items()}
    return value


def concatenate(pieces: Sequence[Any], sizes: Sequence[int]) -> Any:
    """Put per-micro-batch outputs back together along the batch dimension.

    Tensors whose first dimension is their micro-batch's size are concatenated; tuples and lists
    recursively; anything else (a scalar, a tensor without a batch dimension) is taken from the
    first piece.
    """
    first = pieces[0]
    if isinstance(first, torch.Tensor):
        if first.dim() > 0 and all(p.dim() > 0 and p.shape[0] == n for p, n in zip(pieces, sizes)):
            return torch.cat(list(pieces), dim=0)
        return first
    if isinstance(first, (tuple, list)):
        return type(first)(concatenate([p[i] for p in pieces], sizes) for i in range(len(first)))
    return first
