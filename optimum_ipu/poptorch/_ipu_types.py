"""The IPU's types, as PopTorch applies them to a compiled model's inputs, weights and results.

The IPU has neither float64 nor int64. PopTorch computes a float64 input or weight as float32 and returns
integer results as int32 and floating ones as at most float32 (its user guide, "Supported types";
`type_support_test.py`). Programs see it: `argmax` of a compiled model is an int32 tensor, a
`model.double()` returns float32.

Half activations with float32 weights compute in half: "the parameters will be converted to float16 if
you call an operation with a float16 input" (user guide, "16-bit float support"), where CPU PyTorch
raises "expected scalar type Half but found Float". The update still applies to the float32 weights.

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

__all__ = ["as_fed", "as_returned", "device_dtype", "half_inputs_with_float_weights", "weights_follow_half_inputs"]

# What the IPU computes a host dtype as (the others it has).
_DEMOTED = {torch.float64: torch.float32, torch.int64: torch.int32}


def device_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the IPU holds a floating weight or buffer of `dtype` in (float64 -> float32).

    Integer buffers stay as they are, for the reason the module docstring gives."""
    return torch.float32 if dtype == torch.float64 else dtype


def as_fed(value: Any, model_dtype: torch.dtype | None, device: torch.device | None, copy: bool = False) -> Any:
    """An input as the compiled model receives it: the caller's own tensor when nothing changes (an
    in-place update of an input in `forward()` reaches the caller), unless `copy` (the compile's trace,
    whose run must not reach the caller: the call's own run does, once).

    Floating inputs take the model's floating dtype (the executable's rule for IPUTrainer too), float64
    becoming float32, except that float16 inputs of a float32 model stay half, so half activations meet
    float32 weights (`weights_follow_half_inputs`). Other tensors keep their dtype.

    Args:
        value: one input leaf (a tensor or any other value, returned as it is).
        model_dtype: the floating dtype of the model's weights on the device (None: a model without
            floating weights, whose inputs keep their floating dtype, float64 still demoted).
        device: where the model's weights are (None: leave the input where it is).
        copy: always return a new tensor.
    """
    if not isinstance(value, torch.Tensor):
        return value
    dtype = value.dtype
    if value.is_floating_point():
        if model_dtype is None:
            dtype = device_dtype(dtype)
        elif not (model_dtype == torch.float32 and dtype == torch.float16):
            dtype = model_dtype
    return value.to(device if device is not None else value.device, dtype, copy=copy)


def as_returned(outputs: Any) -> Any:
    """A call's results as the IPU returns them: int64 tensors as int32, float64 ones as float32."""

    def demoted(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype in _DEMOTED:
            return value.to(_DEMOTED[value.dtype])
        return value

    return pytree.tree_map(demoted, outputs)


def half_inputs_with_float_weights(model: nn.Module, inputs: list[Any]) -> bool:
    """Whether a compile's inputs are half while some of the model's weights are float32: then the calls
    run under `weights_follow_half_inputs`."""
    half = any(isinstance(t, torch.Tensor) and t.dtype == torch.float16 for t in inputs)
    return half and any(p.dtype == torch.float32 for p in model.parameters())


class _WeightsFollowHalfInputs(TorchFunctionMode):
    """Casts float32 parameters to half for an op that also takes a half tensor (autograd records the
    cast, so the gradient reaches the float32 weight in float32)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        values = [*args, *kwargs.values()]
        if any(isinstance(v, torch.Tensor) and v.dtype == torch.float16 for v in values) and any(
            isinstance(v, nn.Parameter) and v.dtype == torch.float32 for v in values
        ):
            args = tuple(_half_if_float_weight(v) for v in args)
            kwargs = {k: _half_if_float_weight(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def _half_if_float_weight(value: Any) -> Any:
    if isinstance(value, nn.Parameter) and value.dtype == torch.float32:
        return value.half()
    return value


@contextlib.contextmanager
def weights_follow_half_inputs(active: bool) -> Iterator[None]:
    """While active (and `active`), an op given half activations and float32 weights computes in half,
    as on PopTorch; otherwise nothing changes and no per-op hook runs."""
    if not active:
        yield
        return
    with _WeightsFollowHalfInputs():
        yield
