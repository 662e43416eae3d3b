"""The mark a placement annotation leaves on a module: the block it starts, and on which IPU.

PopTorch's `BeginBlock(layer, user_id, ipu_id)` marks `layer` in place (`optimum_ipu/poptorch/_annotations.py`
writes and removes the mark); a model that places itself with those calls, as Optimum Graphcore's
`PipelineMixin.parallelize()` does, is read back from its marks by `self_placed.py`. The mark lives
here, below both readers, so that they read one attribute the same way.
"""

from __future__ import annotations

from torch import nn

__all__ = ["block_mark", "clear_block_mark", "set_block_mark"]

_MARK = "_poptorch_block"  # PopTorch's attribute name: a model pickled with its blocks keeps them


def block_mark(module: nn.Module) -> tuple[str | None, int | None] | None:
    """`(user_id, ipu_id)` of the block `module` starts, or None; an `ipu_id` of None stays on the IPU
    of the block before."""
    return module.__dict__.get(_MARK)


def set_block_mark(module: nn.Module, user_id: str | None, ipu_id: int | None) -> None:
    """Mark `module` as the start of block `user_id` on IPU `ipu_id` (not a submodule, not a parameter)."""
    object.__setattr__(module, _MARK, (user_id, ipu_id))


def clear_block_mark(module: nn.Module) -> None:
    """Remove `module`'s mark, if it has one."""
    module.__dict__.pop(_MARK, None)
