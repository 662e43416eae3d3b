"""Placement annotations: `BeginBlock`, `Block`, `BlockFunction`, `removeBlocks`, and the IPU sequence they give.

On the IPU these split the traced graph into blocks on IPUs. The simulated IPU runs the module as it
is (pipelined, sharded and one-device execution compute the same values), so the annotations only
record, while a compile-time trace runs, the order in which the forward visits IPUs: the wrapper's
compile checks (gradient accumulation against pipeline stages, IPU counts) read it.

Ops before the first block run on IPU 0; a block started by `BeginBlock` or `Block.start` lasts until
the next one starts, but leaving a `with poptorch.Block(...)` (or a `BlockFunction`) leaves no block
active, and PopTorch's compile then refuses any op until the next block starts ("No active Block, all
the ops must belong to a Block"): the trace does the same (`_OpsNeedABlock`).

What they leave on a model pickles and deep-copies, as on PopTorch: `BeginBlock`'s forward pre-hook
is an object (`_BlockHook`, shown by `poptorch.module_repr` as PopTorch shows it) and a function
wrapped by `BlockFunction` is a `_BlockFunction`, which pickles by name where it replaced a function
of a module (the decorator's usual place) and otherwise as the function it wraps plus the block.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from optimum_ipu.pipelining.block_marks import block_mark, clear_block_mark, set_block_mark
from optimum_ipu.poptorch._logging import Error

__all__ = ["BeginBlock", "Block", "BlockFunction", "check_ipu_id", "recording_ipus", "removeBlocks"]

_trace: list[tuple[str | None, int]] | None = None
_auto_id = False
_auto_count = 0
_ended: tuple[str | None, int] | None = None  # while tracing: the `with Block` just left, until a block starts

# Tensor methods that read metadata only: no op in the traced graph, so allowed outside any block.
_METADATA = {"__get__", "__set__", "size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset",
             "is_contiguous", "is_floating_point", "is_complex", "element_size", "get_device", "data_ptr",
             "__len__", "__repr__", "__str__", "__format__", "__hash__"}  # fmt: skip


def check_ipu_id(ipu_id: Any, where: str) -> int | None:
    """`ipu_id` as an int, None kept (stay on the previous block's IPU); an `Error` naming `where` and the
    value for anything but a non-negative integer, which would otherwise be accepted and only
    misplace the blocks (a negative index) or fail later in the placement arithmetic."""
    if ipu_id is None:
        return None
    try:
        value = None if isinstance(ipu_id, bool) else operator.index(ipu_id)
    except TypeError:
        value = None
    if value is None or value < 0:
        raise Error(
            f"{where}: ipu_id must be a non-negative integer (the index of an IPU in the model's multi-IPU "
            f"device, 0 for the first), got {ipu_id!r}. Use ipu_id=0, 1, ..., or leave it out to stay on the "
            "IPU of the block before."
        )
    return value


def _enter(user_id: str | None, ipu_id: int | None) -> None:
    global _auto_count, _ended
    _ended = None
    if user_id is None and _auto_id:
        user_id = str(_auto_count)
        _auto_count += 1
    if _trace is not None:
        last_ipu = _trace[-1][1] if _trace else 0
        _trace.append((user_id, last_ipu if ipu_id is None else int(ipu_id)))


class _OpsNeedABlock(TorchFunctionMode):
    """While a trace runs: an op on tensors after a `with Block` ended, before the next block, is PopTorch's
    compile error (its lowering finds no active IPU for the op)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _ended is not None and getattr(func, "__name__", "") not in _METADATA:
            if any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves((args, kwargs))):
                user_id, ipu = _ended
                raise Error(
                    "No active Block, all the ops must belong to a Block: the forward runs "
                    f"{getattr(func, '__qualname__', func)!r} after `with poptorch.Block(user_id={user_id!r})` (on "
                    f"IPU {ipu}) ended, before another block starts. Move the op inside a block (indent it into the "
                    "`with`, or into a BlockFunction), or start the next block before it (`with poptorch.Block(...)`, "
                    "poptorch.Block.start(...), or BeginBlock on the module that runs it)."
                )
        return func(*args, **kwargs)


@contextlib.contextmanager
def recording_ipus(refuse_ops_outside_blocks: bool = False) -> Iterator[list[tuple[str | None, int]]]:
    """While active, every block the forward enters is appended as (user id, IPU id); with
    `refuse_ops_outside_blocks` (the compile trace: no hook of ours computes there), an op outside any
    block after a `with Block` ended is refused as PopTorch's compile refuses it."""
    global _trace, _ended
    previous, _trace = _trace, [(None, 0)]  # the first layers default to IPU 0
    previous_ended, _ended = _ended, None
    try:
        with _OpsNeedABlock() if refuse_ops_outside_blocks else contextlib.nullcontext():
            yield _trace
    finally:
        _trace, _ended = previous, previous_ended


class Block(contextlib.ContextDecorator):
    """`with poptorch.Block(user_id, ipu_id):` the layers called inside run on IPU `ipu_id`."""

    def __init__(self, user_id: str | None = None, ipu_id: int | None = None):
        self.user_id, self.ipu_id = user_id, check_ipu_id(ipu_id, f"Block(user_id={user_id!r})")

    @staticmethod
    def useAutoId() -> None:
        """Give blocks without a user id consecutive ids ("0", "1", ...)."""
        global _auto_id, _auto_count
        _auto_id, _auto_count = True, 0

    @staticmethod
    def start(user_id: str | None = None, ipu_id: int | None = None) -> None:
        _enter(user_id, check_ipu_id(ipu_id, f"Block.start(user_id={user_id!r})"))

    def __enter__(self) -> Block:
        _enter(self.user_id, self.ipu_id)
        self._entered = _trace[-1] if _trace is not None else None  # (user id, IPU) as traced
        return self

    def __exit__(self, *exc) -> None:
        global _ended
        if _trace is not None:  # no block is active until the next one starts (PopTorch's end of a block)
            _ended = getattr(self, "_entered", None) or _trace[-1]
        return None


def _pre_hook(module: nn.Module, _args) -> None:
    """BeginBlock's hook before `_BlockHook` (files exported then still name it)."""
    user_id, ipu_id = block_mark(module)
    _enter(user_id, ipu_id)


class _BlockHook:
    """BeginBlock's forward pre-hook: the module starts block `user_id` on IPU `ipu_id` when it runs.

    An object rather than a closure so a model pickles and deep-copies with its blocks, and with
    PopTorch's repr, which `poptorch.module_repr` prints before the module's name.
    """

    def __init__(self, user_id: str | None, ipu_id: int | None):
        self.user_id, self.ipu_id = user_id, ipu_id

    def __call__(self, module: nn.Module, _args) -> None:
        _enter(self.user_id, self.ipu_id)

    def __repr__(self) -> str:
        return f"BeginBlock(user_id={self.user_id}, ipu_id={self.ipu_id})"


class LegacyBeginBlockFn(nn.Module):
    """What `BeginBlock(function, user_id, ipu_id)` returns: a module that starts the block, then calls
    `function` (PopTorch 3.4 still accepts a callable there, from when BeginBlock wrapped rather than annotated).
    PopTorch's class name, so the model prints as it did there."""

    def __init__(self, function: Any, user_id: str | None, ipu_id: int | None):
        super().__init__()
        self._function, self._user_id, self._ipu_id = function, user_id, ipu_id

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        _enter(self._user_id, self._ipu_id)
        return self._function(*args, **kwargs)


def BeginBlock(layer: nn.Module, user_id: str | None = None, ipu_id: int | None = None) -> nn.Module:
    """Start a new block at `layer` (on IPU `ipu_id`); the layers after it stay in the block.

    A module is annotated in place and returned. Any other callable (PopTorch's legacy form) is
    wrapped in a module that starts the block and then calls it: use the module returned.
    """
    where = f"BeginBlock({type(layer).__name__}, user_id={user_id!r})"
    if not isinstance(layer, nn.Module):
        if callable(layer):
            return LegacyBeginBlockFn(layer, user_id, check_ipu_id(ipu_id, where))
        raise Error(  # PopTorch's sentence, then what it got
            f"module is not an instance of torch.nn.Module or function: BeginBlock got {type(layer).__name__}. "
            "Pass the layer (module) that starts the block."
        )
    if block_mark(layer) is not None:
        raise Error("module has already been assigned to a block.")
    ipu_id = check_ipu_id(ipu_id, where)
    set_block_mark(layer, user_id, ipu_id)
    hook = layer.register_forward_pre_hook(_BlockHook(user_id, ipu_id))
    object.__setattr__(layer, "_poptorch_block_hook", hook)
    return layer


class _BlockFunction:
    """A function wrapped by `BlockFunction(user_id, ipu_id)`: each call runs inside that block.

    It keeps the function's name, docstring and signature (`functools.update_wrapper`), binds as a
    method when it decorates one, and pickles: by its name when it is what its module holds under
    that name (a decorated top-level function), else as the wrapped function and the block.
    """

    def __init__(self, function: Any, user_id: str | None, ipu_id: int | None):
        functools.update_wrapper(self, function)
        self.function, self.user_id, self.ipu_id = function, user_id, ipu_id

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with Block(self.user_id, self.ipu_id):
            return self.function(*args, **kwargs)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)

    def __reduce__(self):
        if _found_by_name(self):
            return self.__qualname__  # pickle (and deepcopy) it as the global it is
        return _BlockFunction, (self.function, self.user_id, self.ipu_id)

    def __repr__(self) -> str:
        return f"BlockFunction(user_id={self.user_id!r}, ipu_id={self.ipu_id})({self.function!r})"


def _found_by_name(wrapper: _BlockFunction) -> bool:
    """Whether `module.qualname` of the wrapped function leads to `wrapper` itself (it replaced the function)."""
    value = sys.modules.get(getattr(wrapper, "__module__", None) or "")
    for part in str(getattr(wrapper, "__qualname__", "")).split("."):
        value = getattr(value, part, None)
        if isinstance(value, types.MethodType):
            value = value.__func__
    return value is wrapper


def BlockFunction(user_id: str | None = None, ipu_id: int | None = None):
    """Decorator: the function's ops run in block `user_id` on IPU `ipu_id` (a picklable `_BlockFunction`)."""
    ipu_id = check_ipu_id(ipu_id, f"BlockFunction(user_id={user_id!r})")

    def decorate(func):
        return _BlockFunction(func, user_id, ipu_id)

    return decorate


def removeBlocks(module: nn.Module) -> None:
    """Remove every `BeginBlock` annotation from `module` and its sub-modules."""
    for m in module.modules():
        if block_mark(m) is not None:
            m._poptorch_block_hook.remove()
            object.__delattr__(m, "_poptorch_block_hook")
            clear_block_mark(m)
