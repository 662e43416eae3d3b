"""PopTorch's ops that mark or annotate a graph: `identity_loss`, and the annotations that change nothing here."""

from __future__ import annotations

import torch

from optimum_ipu.poptorch._logging import Error, no_effect
from optimum_ipu.poptorch._outputs import IDENTITY_LOSS
from optimum_ipu.poptorch._recompute import note_checkpoint

__all__ = [
    "custom_op",
    "identity_loss",
    "ipu_print_tensor",
    "nop",
    "recomputationCheckpoint",
    "serializedMatMul",
    "set_available_memory",
]


def identity_loss(x: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    """Mark `x` as the model's loss, reduced by "sum", "mean" or "none" (backward then sends ones)."""
    if reduction == "sum":
        out = x.sum()
    elif reduction == "mean":
        out = x.mean()
    elif reduction == "none":
        out = x.view_as(x) if x.requires_grad else x.clone()
    else:
        raise ValueError(f'identity_loss reduction must be "sum", "mean" or "none", got {reduction!r}.')
    setattr(out, IDENTITY_LOSS, True)
    return out


def nop(tensor: torch.Tensor) -> torch.Tensor:
    """An identity op (on the IPU, a barrier the compiler keeps); the tensor itself here."""
    return tensor


def set_available_memory(tensor: torch.Tensor, available_memory_proportion: float) -> torch.Tensor:
    """Per-op share of tile memory for the op making `tensor`: recorded for the cost model only."""
    if not 0 < float(available_memory_proportion) <= 1:
        raise ValueError(f"available_memory_proportion must be in (0, 1], got {available_memory_proportion}.")
    no_effect(
        "poptorch.set_available_memory", "tile memory planning is not simulated; the arithmetic is unchanged."
    )
    return tensor


def ipu_print_tensor(
    tensor: torch.Tensor, title: str = "", print_gradient: bool = True, summarise_threshold: int = 1000
):
    """Print `tensor` when the op runs (and its gradient in backward, as the IPU's print op does)."""
    print(f"{title}: {tensor}" if title else tensor)
    if print_gradient and tensor.requires_grad:
        tensor.register_hook(lambda g: print(f"{title or 'tensor'} gradient: {g}"))
    return tensor


def recomputationCheckpoint(*tensors: torch.Tensor):
    """Keep these tensors for backward; recompute what was computed since the previous checkpoint.

    Returns the tensors unchanged. In training with recomputation on (a pipelined model of two or
    more stages, or `opts._Popart.set("autoRecomputation", n)` with n > 0, as on PopTorch) the module
    whose output a checkpointed tensor is runs again during backward, from its input, instead of
    keeping its inner activations (`optimum_ipu/poptorch/_recompute.py`).
    """
    note_checkpoint(tensors)
    return tensors[0] if len(tensors) == 1 else tensors


def serializedMatMul(
    lhs: torch.Tensor, rhs: torch.Tensor, mode, factor: int = 0, keep_precision: bool = False
):
    """A matmul the IPU splits into `factor` pieces to save memory: the same product here."""
    no_effect("poptorch.serializedMatMul", "the product is computed whole; the value is the same.")
    return torch.matmul(lhs, rhs)


def custom_op(inputs, name: str, domain: str, domain_version: int, example_outputs, attributes=None):
    """PopTorch's custom op runs a Poplar codelet on the IPU: there is no IPU code to run here."""
    raise Error(
        f"poptorch.custom_op({name!r}, domain {domain!r}) runs a Poplar/PopART custom operation compiled for the "
        "IPU; the simulated IPU cannot run IPU code. Write the op in PyTorch (a torch.autograd.Function) and call "
        "it instead."
    )
