"""Placement annotations: `BeginBlock`, `Block`, `BlockFunction`, `removeBlocks`, and the IPU sequence they give.

On the IPU these split the traced graph into blocks on IPUs. The simulated IPU runs the module as it
is (pipelined, sharded and one-device execution compute the same values), so the annotations only
record, while a compile-time trace runs, the order in which the forward visits IPUs: the wrapper's
compile checks (gradient accumulation against pipeline stages, IPU counts) read it.

Ops before the first block run on IPU 0; a block started by `BeginBlock` or `Block.start` lasts until
the next one starts, but leaving a `with poptorch.Block(...)` (or a `BlockFunction`) leaves no block
active, and PopTorch's compile then refuses any op until the next block starts ("No active Block, all
the ops must belong to a Block"): the trace does the same (`_OpsNeedABlock`).
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from optimum_ipu.poptorch._logging import Error

__all__ = ["BeginBlock", "Block", "BlockFunction", "check_ipu_id", "recording_ipus", "removeBlocks"]

_BLOCK_ATTR = "_poptorch_block"
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
    user_id, ipu_id = getattr(module, _BLOCK_ATTR)
    _enter(user_id, ipu_id)


def BeginBlock(layer: nn.Module, user_id: str | None = None, ipu_id: int | None = None) -> nn.Module:
    """Start a new block at `layer` (on IPU `ipu_id`); the layers after it stay in the block."""
    if not isinstance(layer, nn.Module):
        raise Error(f"BeginBlock takes a torch.nn.Module, got {type(layer).__name__}.")
    if hasattr(layer, _BLOCK_ATTR):
        raise Error("module has already been assigned to a block.")
    ipu_id = check_ipu_id(ipu_id, f"BeginBlock({type(layer).__name__}, user_id={user_id!r})")
    object.__setattr__(layer, _BLOCK_ATTR, (user_id, ipu_id))
    object.__setattr__(layer, "_poptorch_block_hook", layer.register_forward_pre_hook(_pre_hook))
    return layer


def BlockFunction(user_id: str | None = None, ipu_id: int | None = None):
    """Decorator: the function's ops run in block `user_id` on IPU `ipu_id`."""
    ipu_id = check_ipu_id(ipu_id, f"BlockFunction(user_id={user_id!r})")

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with Block(user_id, ipu_id):
                return func(*args, **kwargs)

        return wrapper

    return decorate


def removeBlocks(module: nn.Module) -> None:
    """Remove every `BeginBlock` annotation from `module` and its sub-modules."""
    for m in module.modules():
        if hasattr(m, _BLOCK_ATTR):
            m._poptorch_block_hook.remove()
            object.__delattr__(m, "_poptorch_block_hook")
            object.__delattr__(m, _BLOCK_ATTR)
