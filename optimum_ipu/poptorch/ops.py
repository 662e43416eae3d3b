"""PopTorch's ops that mark or annotate a graph: `identity_loss`, and the annotations that change nothing here."""

from __future__ import annotations

import torch

from optimum_ipu.poptorch._logging import no_effect
from optimum_ipu.poptorch._outputs import IDENTITY_LOSS

__all__ = ["identity_loss", "ipu_print_tensor", "nop", "set_available_memory"]


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
