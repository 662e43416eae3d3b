"""PopTorch's ops that mark or annotate a graph: `identity_loss`, the annotations that change nothing here
(memory, serialisation, overlapped host I/O), and `custom_op` (the applications' ops, in `custom_ops.py`)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from optimum_ipu.poptorch._ipu_context import current
from optimum_ipu.poptorch._logging import Error, no_effect
from optimum_ipu.poptorch._outputs import IDENTITY_LOSS
from optimum_ipu.poptorch._recompute import note_checkpoint
from optimum_ipu.poptorch.blocks import PipelinedExecution, ShardedExecution
from optimum_ipu.poptorch.custom_ops import run_custom_op
from optimum_ipu.poptorch.enums import OutputMode, OverlapMode

__all__ = [
    "custom_op",
    "identity_loss",
    "ipu_print_tensor",
    "nop",
    "recomputationCheckpoint",
    "serializedMatMul",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
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
    """Print `tensor` when the op runs (and its gradient in backward, as the IPU's print op does).

    Nothing is printed while a wrapper compiles (its traces are not runs of the model, as on PopTorch).
    """
    running = current()
    if running is not None and running.compiling:
        return tensor
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


def custom_op(
    inputs: tuple[torch.Tensor, ...] | list[torch.Tensor],
    name: str,
    domain: str,
    domain_version: int,
    example_outputs: tuple[torch.Tensor, ...] | list[torch.Tensor],
    attributes: dict[str, float | int | str | list | tuple] | None = None,
) -> list[torch.Tensor]:
    """Run the PopART custom op `name` of `domain` on `inputs`; returns a list shaped like `example_outputs`.

    The ops Graphcore's applications load from their C++ libraries (RemapCE, CopyTensor, Ctc,
    ExpMovAvg, Nms) run by name, written in PyTorch (`custom_ops.py`); any other is an error naming
    it. `attributes` are checked as PopTorch checks them.
    """
    return run_custom_op(inputs, name, domain, domain_version, example_outputs, attributes)


def _check_overlapped_io(mode: OverlapMode) -> None:
    """PopTorch's compile checks for overlapped host I/O, made when a wrapper runs the model."""
    running = current()
    if running is None or mode == OverlapMode.NoOverlap:
        return
    options = running.options
    strategy = options.execution_strategy
    if isinstance(strategy, PipelinedExecution) and not isinstance(strategy, ShardedExecution):
        raise Error(
            "Overlapped IO is not supported with poptorch.PipelinedExecution. If you are using only one IPU, "
            "please switch to poptorch.ShardedExecution."
        )
    if not options.TensorLocations._values.get("num_io_tiles"):
        raise Error(
            "No IO tiles allocated. You must allocate at least 32 IO tiles using "
            "poptorch.Options().TensorLocations.numIOTiles."
        )
    output_mode = options.output_mode
    if output_mode == OutputMode.Default:
        output_mode = OutputMode.Final if running.training else OutputMode.All
    if output_mode not in (OutputMode.All, OutputMode.Sum):
        raise Error(
            "Unsupported output mode for overlapped IO. Please switch output mode to poptorch.OutputMode.All or "
            "poptorch.OutputMode.Sum."
        )


def _set_overlap(tensors: Any, mode: OverlapMode, kind: str) -> Any:
    for leaf in pytree.tree_leaves(tensors):
        if not isinstance(leaf, torch.Tensor):
            raise Error(f"You may only set overlap for torch.tensor {kind}. {type(leaf)} is not supported.")
    if not isinstance(mode, OverlapMode):
        raise Error(f"set_overlap_for_{kind[:-1]} takes a poptorch.OverlapMode, got {mode!r}.")
    _check_overlapped_io(mode)
    no_effect(f"poptorch.set_overlap_for_{kind[:-1]}", "host I/O is not simulated; the values are the same.")
    return tensors


def set_overlap_for_input(input_tensors: Any, mode: OverlapMode) -> Any:
    """Overlap the host-to-IPU copy of these inputs (a tensor, or a tuple/list/dict of them) with compute.

    Returns the inputs unchanged. Inside a wrapper, PopTorch's requirements are checked: an
    execution strategy other than `PipelinedExecution`, `TensorLocations.numIOTiles` set, and
    `OutputMode.All` or `Sum`.
    """
    return _set_overlap(input_tensors, mode, "inputs")


def set_overlap_for_output(output_tensors: Any, mode: OverlapMode) -> Any:
    """Overlap the IPU-to-host copy of these outputs with compute; returns them unchanged (checks as for inputs)."""
    return _set_overlap(output_tensors, mode, "outputs")
