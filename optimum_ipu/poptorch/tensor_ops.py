"""PopTorch's ops that compute values: `dynamic_slice` and `dynamic_update` (a fixed-size slice at a start
held in a tensor).

On the IPU these lower to PopLibs' dynamic slice, whose offsets are taken modulo the sliced dimension;
here they are index ops on the same indices, so gradients flow through them in a `trainingModel`.
"""

from __future__ import annotations

from typing import Any

import torch

from optimum_ipu.poptorch._logging import Error

__all__ = ["dynamic_slice", "dynamic_update"]


def _check_size(size: int) -> None:
    if size == 0:
        raise Error("The start and end of a slice must be different.")
    if size < 0:
        raise Error("Taking a slice of a tensor with the end less than the start is not supported.")


def _indices(tensor: torch.Tensor, dim: int, start: torch.Tensor, size: int) -> torch.Tensor:
    """Positions `start, start + 1, ..., start + size - 1` along `dim`, modulo its length (PopLibs' rule)."""
    if start.numel() != 1:
        raise Error(
            f"The start of a dynamic slice must be a tensor of one element, got shape {tuple(start.shape)}."
        )
    length = tensor.shape[dim]
    first = start.reshape(1).to(device=tensor.device).long()
    return (first + torch.arange(size, device=tensor.device)) % length


def _check_tensor_dim_start(op: str, tensor: Any, dim: Any, start: Any) -> None:
    """PopTorch's type checks, in its order and words, of the arguments both dynamic ops take."""
    if not isinstance(tensor, torch.Tensor):
        raise Error(f"{op} must take a torch.tensor input. {type(tensor)} is not supported.")
    if not isinstance(dim, int):
        raise Error("Dimension must be an integer.")
    if not isinstance(start, torch.Tensor):
        raise Error(f"Slice start argument to {op} must be a torch.tensor. {type(start)} is not supported.")


def dynamic_slice(tensor: torch.Tensor, dim: int, start: torch.Tensor, size: int, step: int) -> torch.Tensor:
    """`size` elements of `tensor` along `dim` from the position held in `start`, then every `step`-th of them.

    The same as `tensor.narrow(dim, int(start), size)[::step]` (along `dim`) without reading `start` on
    the host; `size` must divide the length of `dim`, as on PopTorch, and a start past the end wraps
    around, as PopLibs' dynamic slice does.
    """
    _check_tensor_dim_start("dynamic_slice", tensor, dim, start)
    if not isinstance(size, int):
        raise Error("Size must be an integer.")
    if not isinstance(step, int):
        raise Error("Step must be an integer.")
    _check_size(size)
    if step < 1:
        raise Error("Slicing step must be at least 1")
    dim = dim % tensor.dim()
    length = tensor.shape[dim]
    if length % size:
        raise Error(f"The size of the slice ({size}) must be a factor of the slicing dimension ({length}).")
    return tensor.index_select(dim, _indices(tensor, dim, start, size)[::step])


def dynamic_update(
    input: torch.Tensor,  # noqa: A002 - PopTorch's argument name
    src: torch.Tensor,
    dim: int,
    start: torch.Tensor,
    size: int,
) -> torch.Tensor:
    """`input` with the `size` positions along `dim` from the one held in `start` replaced by `src`.

    Returns a new tensor (`input` is unchanged); `src` has `size` elements along `dim` and `input`'s other
    sizes. Gradients flow to both `input` (outside the slice) and `src`.
    """
    _check_tensor_dim_start("dynamic_update", input, dim, start)
    if not isinstance(src, torch.Tensor):
        raise Error(f"Src argument to dynamic_update must be a torch.tensor. {type(src)} is not supported.")
    if not isinstance(size, int):
        raise Error("Size must be an integer.")
    if input.dim() != src.dim():
        raise Error(f"input and src tensors must have same dimensionality. ({input.dim()}) vs ({src.dim()})")
    if input.dtype != src.dtype:
        raise Error(f"input and src tensor must have same dtype. ({input.dtype} vs {src.dtype})")
    _check_size(size)
    dim = dim % input.dim()
    expected = list(input.shape)
    expected[dim] = size
    if list(src.shape) != expected:
        raise Error(
            f"dynamic_update: src has shape {tuple(src.shape)}, but a slice of size {size} along dim {dim} of an "
            f"input of shape {tuple(input.shape)} has shape {tuple(expected)}."
        )
    return input.index_copy(dim, _indices(input, dim, start, size), src)
