"""The IPU's types, as PopTorch applies them to a compiled model's inputs, weights and results.

The IPU has neither float64 nor int64. PopTorch computes a float64 input or weight as float32 and returns
integer results as int32 and floating ones as at most float32 (its user guide, "Supported types";
`type_support_test.py`). Programs see it: `argmax` of a compiled model is an int32 tensor, a
`model.double()` returns float32.

Weights follow the activations' precision: "the parameters will be converted to float16 if you call an
operation with a float16 input" (user guide, "16-bit float support"), and float32 activations meeting a
`.half()` model's weights compute in float32 (PopTorch's half_float_test: float32 in, float32 out), where
CPU PyTorch raises "expected scalar type Half but found Float" for either mix. The update still applies to
the weights in their own dtype.

What is not reproduced, on purpose: integer inputs and buffers keep int64 inside `forward()`, because
CPU PyTorch's ops require it (`cross_entropy` targets, `index_select`); only what a call returns is
int32, so a value beyond the int32 range, which would wrap on the IPU, is kept here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

__all__ = ["as_fed", "as_returned", "device_dtype", "mixed_precision", "weights_follow_activations"]

# What the IPU computes a host dtype as (the others it has).
_DEMOTED = {torch.float64: torch.float32, torch.int64: torch.int32}


def device_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the IPU holds a floating weight or buffer of `dtype` in (float64 -> float32).

    Integer buffers stay as they are, for the reason the module docstring gives."""
    return torch.float32 if dtype == torch.float64 else dtype


def as_fed(value: Any, device: torch.device | None, copy: bool = False) -> Any:
    """An input as the compiled model receives it: the caller's own tensor when nothing changes (an
    in-place update of an input in `forward()` reaches the caller), unless `copy` (the compile's trace,
    whose run must not reach the caller: the call's own run does, once).

    Float64 becomes float32; every other dtype is kept (half or float32 activations, whatever the
    weights' dtype: `weights_follow_activations`).

    Args:
        value: one input leaf (a tensor or any other value, returned as it is).
        device: where the model's weights are (None: leave the input where it is).
        copy: always return a new tensor.
    """
    if not isinstance(value, torch.Tensor):
        return value
    return value.to(device if device is not None else value.device, device_dtype(value.dtype), copy=copy)


def as_returned(outputs: Any) -> Any:
    """A call's results as the IPU returns them: int64 tensors as int32, float64 ones as float32."""

    def demoted(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype in _DEMOTED:
            return value.to(_DEMOTED[value.dtype])
        return value

    return pytree.tree_map(demoted, outputs)


_ACTIVATIONS = (torch.float16, torch.bfloat16, torch.float32)


def mixed_precision(model: nn.Module, inputs: list[Any]) -> bool:
    """Whether a compile's floating inputs and the model's floating weights differ in precision (half
    inputs and float32 weights, or float32 inputs and half weights): then the calls run under
    `weights_follow_activations`."""
    fed = {device_dtype(t.dtype) for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()}
    weights = {device_dtype(p.dtype) for p in model.parameters() if p.is_floating_point()}
    return bool(fed and weights and fed | weights != weights)


class _WeightsFollowActivations(TorchFunctionMode):
    """Casts the parameters an op takes to the dtype of its other floating tensors, when those share one of
    half, bfloat16 or float32 (autograd records the cast: the gradient reaches each weight in its dtype)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        values = [*args, *kwargs.values()]
        activations = {
            v.dtype for v in values
            if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter) and v.is_floating_point()
        }  # fmt: skip
        if len(activations) == 1:
            (dtype,) = activations
            if dtype in _ACTIVATIONS and any(
                isinstance(v, nn.Parameter) and v.is_floating_point() and v.dtype != dtype for v in values
            ):
                args = tuple(_as_activation(v, dtype) for v in args)
                kwargs = {k: _as_activation(v, dtype) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def _as_activation(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, nn.Parameter) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    return value


@contextlib.contextmanager
def weights_follow_activations(active: bool) -> Iterator[None]:
    """While active (and `active`), an op given activations of one precision and weights of another
    computes in the activations' precision, as on PopTorch; otherwise nothing changes and no per-op
    hook runs."""
    if not active:
        yield
        return
    with _WeightsFollowActivations():
        yield
