"""Recomputation that recomputes: `recomputationCheckpoint` marks where the backward pass restarts.

On PopTorch a pipelined training model (more than one stage, or `autoRecomputation` set) keeps only
the stage inputs and the checkpointed tensors for backward and recomputes everything else. The
simulated IPU runs the model eagerly, so it recomputes by module: a checkpointed tensor is the
output of the module that produced it last (`h = layer(h)` then `recomputationCheckpoint(h)`, or
`recomputation_checkpoint(layer)`'s forward hook), and that module runs under
`torch.utils.checkpoint` in training: its output is kept, its inner activations are dropped and
computed again, from its input, during backward (with the random state of the forward, so dropout
draws the same mask). Values and gradients are those of the run without recomputation.

Which module made each checkpointed tensor is found once, while `compile()` traces a micro-batch.
A checkpoint on a tensor that is no module's output (`recomputationCheckpoint(h + 1)`) splits
nothing; a warning says so.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import checkpoint

from optimum_ipu.poptorch._logging import logger

__all__ = ["finding_recomputed_modules", "note_checkpoint", "recomputing"]

_trace: _Trace | None = None


class _Trace:
    """Made by the last module to return each tensor, and the modules whose output was checkpointed."""

    def __init__(self, root: nn.Module):
        self.root = root
        self.maker: dict[int, tuple[torch.Tensor, nn.Module]] = {}
        self.modules: list[nn.Module] = []
        self.unsplit = 0

    def completed(self, module: nn.Module, _args, output) -> None:
        for leaf in pytree.tree_leaves(output):
            if isinstance(leaf, torch.Tensor):
                self.maker[id(leaf)] = (leaf, module)

    def checkpointed(self, tensors) -> None:
        for tensor in tensors:
            made = self.maker.get(id(tensor))
            if made is None or made[0] is not tensor or made[1] is self.root:
                self.unsplit += 1
            elif not any(m is made[1] for m in self.modules):
                self.modules.append(made[1])


def note_checkpoint(tensors) -> None:
    """Called by `recomputationCheckpoint`: while a compile trace runs, remember what was checkpointed."""
    if _trace is not None:
        _trace.checkpointed([t for t in tensors if isinstance(t, torch.Tensor)])


@contextlib.contextmanager
def finding_recomputed_modules(model: nn.Module) -> Iterator[list[nn.Module]]:
    """While active, a forward of `model` records the modules whose outputs it checkpoints (in order)."""
    global _trace
    previous, _trace = _trace, _Trace(model)
    # Run before the user's own forward hooks, so a hook that checkpoints the output finds its module.
    handles = [m.register_forward_hook(_trace.completed, prepend=True) for m in model.modules()]
    found: list[nn.Module] = []
    try:
        yield found
        found.extend(_trace.modules)
        if _trace.unsplit:
            logger.warning(
                "%d tensor(s) given to poptorch.recomputationCheckpoint are not the output of a module: the "
                "simulated IPU recomputes whole modules (a checkpoint on a module's output), so these split "
                "nothing and their activations are kept.",
                _trace.unsplit,
            )
    finally:
        for handle in handles:
            handle.remove()
        _trace = previous


def _recomputed_forward(forward, *args, **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


@contextlib.contextmanager
def recomputing(modules: list[nn.Module]) -> Iterator[None]:
    """While active, each of `modules` keeps only its input and output for backward and recomputes the rest."""
    saved = []
    for module in modules:
        saved.append((module, module.__dict__.get("forward")))
        module.forward = functools.partial(_recomputed_forward, module.forward)
    try:
        yield
    finally:
        for module, own in reversed(saved):
            if own is None:
                del module.forward
            else:
                module.forward = own
