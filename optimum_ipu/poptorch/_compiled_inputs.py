"""A compiled model takes the inputs it was compiled for: the same arguments, types, dtypes and shapes.

PopTorch compiles a static graph for the first call's inputs; a later call whose arguments differ (another
set of arguments, a tensor of another dtype or shape, another value of a non-tensor argument, which is a
constant of the graph) raises `poptorch.Error` with PopTorch's wording, ending in what to do. Without this
check the simulated IPU would run the new inputs (a static graph cannot), or fail deep inside with a
KeyError.

A model is compiled only for inputs (and floating-point weights) with at least one element in every
dimension: PopTorch's graph holds no zero-sized tensor, and its compile says so ("Zero-sized tensors are
unsupported (Got shape [0, 4])."), naming the shape one micro-batch has; `check_not_zero_sized` adds which
input or weight it is and what to change.

The compile's inputs are kept as `_export.example_of` records them (tensors as shape and dtype), the same
record a saved executable holds. Arguments are named by the signature of the module's `forward`, so a
tensor passed by position at compile and by name later is the same argument, as PopTorch's parser takes it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from optimum_ipu.poptorch._export import ExampleTensor
from optimum_ipu.poptorch._logging import Error

__all__ = ["check_inputs", "check_not_zero_sized"]

END = (
    "\nThis error occurred because the inputs passed at runtime don't match the inputs used to compile the "
    "model.\nTo recompile the model for the new inputs create a new inferenceModel / trainingModel wrapper or "
    "call destroy() on the current one and try again."
)

_CONSTANTS = (bool, int, float, complex, str, bytes, type(None))


def _named(forward: Callable, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """The call's arguments by the name `forward` gives them (None when its signature does not bind them)."""
    try:
        bound = inspect.signature(forward).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


def check_inputs(forward: Callable, compiled: tuple[tuple, dict], args: tuple, kwargs: dict) -> None:
    """Raise PopTorch's `poptorch.Error` when `(args, kwargs)` differ from the inputs compiled for.

    Args:
        forward: the module's forward (its signature names the arguments).
        compiled: the compile's `(args, kwargs)` as `_export.example_of` records them.
        args, kwargs: this call's.
    """
    compiled_args, compiled_kwargs = compiled
    expected = _named(forward, compiled_args, compiled_kwargs)
    given = _named(forward, args, kwargs)
    if expected is None or given is None:  # no signature to name them by: PopTorch's own structure
        if len(args) != len(compiled_args):
            raise Error(
                f"Number of positional arguments mismatch: expected {len(compiled_args)} arguments but got "
                f"{len(args)}.{END}"
            )
        expected = {**{f"args[{i}]": a for i, a in enumerate(compiled_args)}, **compiled_kwargs}
        given = {**{f"args[{i}]": a for i, a in enumerate(args)}, **kwargs}
    if not compiled_kwargs and not kwargs and len(args) != len(compiled_args):
        raise Error(
            f"Number of positional arguments mismatch: expected {len(compiled_args)} arguments but got "
            f"{len(args)}.{END}"
        )
    _check_keys("named arguments", expected, given)
    for name, value in expected.items():
        _check(name, value, given[name])


def _check_keys(name: str, expected: Mapping, given: Mapping) -> None:
    if set(expected) == set(given):
        return
    details = []
    extra = set(given) - set(expected)
    if extra:
        details.append("Unexpected arguments: " + ", ".join(sorted(map(str, extra))))
    missing = set(expected) - set(given)
    if missing:
        details.append("Missing arguments: " + ", ".join(sorted(map(str, missing))))
    raise Error(f"Keys mismatch for {name}: {'. '.join(details)}.{END}")


def _check(name: str, compiled: Any, given: Any) -> None:
    """One argument (or part of one) against the compile's record of it."""
    if isinstance(compiled, ExampleTensor):
        if not isinstance(given, torch.Tensor):
            raise Error(f"Type mismatch for {name}: expected {torch.Tensor} but got {type(given)}.{END}")
        if given.dtype != compiled.dtype:
            raise Error(f"Data type mismatch for {name}: expected {compiled.dtype} but got {given.dtype}.{END}")
        if tuple(given.shape) != tuple(compiled.shape):
            raise Error(
                f"Shape mismatch for {name}: expected {torch.Size(compiled.shape)} but got {given.shape}.{END}"
            )
        return
    if isinstance(compiled, (tuple, list)) and isinstance(given, (tuple, list)):
        if len(compiled) != len(given):
            raise Error(f"Length mismatch for {name}: expected {len(compiled)} elements but got {len(given)}.{END}")
        for i, (c, g) in enumerate(zip(compiled, given)):
            _check(f"{name}[{i}]", c, g)
        return
    if isinstance(compiled, Mapping) and isinstance(given, Mapping):
        _check_keys(name, compiled, given)
        for key, value in compiled.items():
            _check(f"{name}[{key}]", value, given[key])
        return
    if type(compiled) is not type(given) and (
        isinstance(given, torch.Tensor) or isinstance(compiled, (tuple, list, Mapping, *_CONSTANTS))
    ):
        raise Error(f"Type mismatch for {name}: expected {type(compiled)} but got {type(given)}.{END}")
    # Values compiled into the graph (numbers, strings, None) must be the ones compiled for. Other objects
    # (a registered custom argument type) are split into their tensors, which may change from call to call.
    if isinstance(compiled, _CONSTANTS) and compiled != given:
        raise Error(f"Value mismatch for {name}: expected {compiled} but got {given}.{END}")


def _tensors_named(name: str, value: Any) -> list[tuple[str, torch.Tensor]]:
    """The tensors in one argument, each named as a user indexes it (`x`, `inputs[1]`, `batch[labels]`)."""
    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if isinstance(value, (tuple, list)):
        return [found for i, v in enumerate(value) for found in _tensors_named(f"{name}[{i}]", v)]
    if isinstance(value, Mapping):
        return [found for k, v in value.items() for found in _tensors_named(f"{name}[{k}]", v)]
    return []


def _check_weights_not_zero_sized(model: nn.Module) -> None:
    """PopTorch's error for a floating-point parameter or buffer with a dimension of size 0 (it moves them to
    the IPU first; integer ones become constants there, unchecked)."""
    for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, tensor in named:
            if tensor.is_floating_point() and 0 in tensor.shape:
                raise Error(
                    f"Zero-sized tensors are unsupported (Got shape {list(tensor.shape)}). The model's {kind} "
                    f"{name} has a dimension of size 0: a compiled IPU graph holds no empty tensor. Give it at "
                    f"least one element in every dimension (check the sizes the layer is built with), or remove it."
                )


def check_not_zero_sized(model: nn.Module, args: tuple, kwargs: dict, micro_batches: int) -> None:
    """Raise PopTorch's `poptorch.Error` for a weight or an input tensor with a dimension of size 0, naming it.

    Args:
        model: the wrapped module (its floating-point parameters and buffers are checked first, as PopTorch
            moves them to the IPU before the inputs; its forward's signature names the arguments).
        args, kwargs: the compile's inputs (combined batches: dim 0 holds `micro_batches` micro-batches).
        micro_batches: micro-batches per call (deviceIterations x replicas / input group size x GA).
    """
    _check_weights_not_zero_sized(model)
    forward = model.forward
    named = _named(forward, args, kwargs)
    if named is None:
        named = {**{f"args[{i}]": a for i, a in enumerate(args)}, **kwargs}
    for name, tensor in (found for key, value in named.items() for found in _tensors_named(key, value)):
        if tensor.dim() == 0 or 0 not in tensor.shape:
            continue
        shape = list(tensor.shape)
        traced = [shape[0] // micro_batches, *shape[1:]]  # one micro-batch, the shape PopTorch's trace sees
        if shape[0] == 0:
            fix = (
                f"feed a batch of at least {micro_batches} sample{'s' if micro_batches > 1 else ''}, one per "
                "micro-batch of the call (deviceIterations x replicas / input group size x gradientAccumulation; "
                "an empty last batch of a loop is dropped by poptorch.DataLoader's drop_last=True)"
            )
        else:
            fix = f"give dimension {shape.index(0)} at least one element, or leave the empty input out of forward"
        raise Error(
            f"Zero-sized tensors are unsupported (Got shape {traced}). The input {name} of forward has shape "
            f"{shape}, with a dimension of size 0: a compiled IPU graph holds no empty tensor. To run it, {fix}."
        )
