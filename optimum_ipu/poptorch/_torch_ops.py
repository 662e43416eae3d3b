"""The `torch.ops.poptorch.*` operators that programs call directly, registered with `torch.library`.

PopTorch registers its graph-building operators under torch's `poptorch` namespace, and some of
Graphcore's applications call them without a Python wrapper: the CNN and Swin applications open and
close name scopes from module hooks (`torch.ops.poptorch.push_name_scope(name)` /
`pop_name_scope()`), DINO casts with `torch.ops.poptorch.internal_cast(x, "FLOAT16")`. The same
schemas are registered here, each as a `CompositeImplicitAutograd` kernel: it runs on any device
(meta included) and autograd differentiates what it calls (the cast).

Importing this module registers them once per process (`optimum_ipu.poptorch` imports it).
"""

from __future__ import annotations

import torch

from optimum_ipu.poptorch import attributes
from optimum_ipu.poptorch._logging import Error

__all__ = ["ONNX_TYPES", "internal_cast"]

# PopTorch's type names (ONNX's), as `internal_cast` and PopART name tensor types.
ONNX_TYPES: dict[str, torch.dtype] = {
    "UINT8": torch.uint8, "INT8": torch.int8, "INT16": torch.int16, "INT32": torch.int32,
    "INT64": torch.int64, "FLOAT16": torch.float16, "FLOAT": torch.float32, "FLOAT32": torch.float32,
    "DOUBLE": torch.float64, "BFLOAT16": torch.bfloat16, "BOOL": torch.bool,
    "COMPLEX64": torch.complex64, "COMPLEX128": torch.complex128,
}  # fmt: skip


def internal_cast(tensor: torch.Tensor, dtype: str) -> torch.Tensor:
    """`tensor` cast to the type named `dtype` ("FLOAT", "FLOAT16", "INT32", ...); gradients flow through."""
    if dtype not in ONNX_TYPES:
        raise Error(
            f"No at::scalar_type for {dtype}: torch.ops.poptorch.internal_cast takes one of "
            f"{', '.join(ONNX_TYPES)}."
        )
    return tensor.to(ONNX_TYPES[dtype])


# name -> (schema, kernel)
_OPS = {
    "push_name_scope": ("push_name_scope(str name) -> ()", attributes.push_name_scope),
    "pop_name_scope": ("pop_name_scope() -> ()", attributes.pop_name_scope),
    "set_attribute": ("set_attribute(str attribute, str key, str value) -> ()", attributes.set_attribute),
    "clear_attribute": ("clear_attribute(str attribute, str key) -> ()", attributes.clear_attribute),
    "internal_cast": ("internal_cast(Tensor self, str dtype) -> Tensor", internal_cast),
}

# Kept for the life of the process: the operators exist while their Library object does.
_library: torch.library.Library | None = None


def _register() -> None:
    global _library
    missing = [name for name in _OPS if not hasattr(torch.ops.poptorch, name)]
    if not missing:
        return
    _library = torch.library.Library("poptorch", "FRAGMENT")
    for name in missing:
        schema, kernel = _OPS[name]
        _library.define(schema)
        _library.impl(name, kernel, "CompositeImplicitAutograd")


_register()
