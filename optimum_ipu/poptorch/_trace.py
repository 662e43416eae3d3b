"""What compile learns from one micro-batch run through the user's module: where its blocks run.

PopTorch traces the forward once to build its graph. Here a copy of one micro-batch runs through the module
(the caller's inputs are never touched: an in-place update of an input is written by the call), without
gradients, in the mode the wrapper will run it in (a trainingModel's forward may take a branch, and
blocks, that inference does not), and notes the blocks it enters and their IPUs (`BeginBlock` /
`Block` / `Stage`), the block each module ran in (for the compile report), and the modules it
checkpoints (for recomputation). The trace draws no random number from the user's streams and leaves
every module in the train/eval mode it had.

Tensors a module holds as plain attributes (neither parameters nor buffers) are constants of PopTorch's
traced graph: every call sees the value they had at compile (`constants_as_traced`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from optimum_ipu.poptorch._annotations import recording_ipus
from optimum_ipu.poptorch._ipu_types import as_fed, weights_follow_activations
from optimum_ipu.poptorch._recompute import finding_recomputed_modules
from optimum_ipu.poptorch._report import recording_module_blocks

__all__ = ["Trace", "constant_tensors", "constants_as_traced", "reference_tensor", "trace_forward", "weights_device",
           "training_flags_kept"]  # fmt: skip


@dataclass
class Trace:
    """One micro-batch through the model.

    Attributes:
        entries: (block name or None, IPU) of each block the forward entered, in order.
        module_blocks: module path -> index in `entries` of the block it ran in.
        micro: the micro-batch's input leaves, as given; `spec` their tree.
        args, kwargs: the call as the executable feeds it (on the model's device, floating inputs in
            its dtype).
        checkpointed: modules whose outputs the forward checkpoints (`recomputationCheckpoint`).
    """

    entries: list[tuple[str | None, int]]
    module_blocks: dict[str, int]
    micro: list[Any]
    spec: pytree.TreeSpec
    args: tuple
    kwargs: dict
    checkpointed: list[nn.Module]

    @property
    def ipus(self) -> list[int]:
        """The IPU of each block entered, in order."""
        return [ipu for _, ipu in self.entries]


def reference_tensor(model: nn.Module) -> torch.Tensor | None:
    """The tensor whose device (and dtype, for floating inputs) inputs are fed in: the first weight, else
    the first buffer; None for a module with neither (an adder), whose inputs stay as given."""
    first = next(model.parameters(), None)
    return first if first is not None else next(model.buffers(), None)


def weights_device(model: nn.Module) -> torch.device | None:
    """Where `model`'s weights are, which its inputs are fed to (None: a module with no weight or buffer)."""
    first = reference_tensor(model)
    return first.device if first is not None else None


def trace_forward(
    model: nn.Module, micro: list[Any], spec: pytree.TreeSpec, training: bool, mixed_precision: bool = False
) -> Trace:
    """Run one micro-batch (`micro`, leaves of `spec`) through `model` in the mode it will run in, no grad.

    The inputs are fed as a call feeds them (`_ipu_types.as_fed`), as copies: PopTorch's compile runs no
    forward on the caller's tensors, so an in-place update of an input in `forward()` reaches the caller
    once per call, by the call's own run, never by the trace. `mixed_precision`: the weights follow the
    activations' precision (`_ipu_types.weights_follow_activations`).
    """
    args, kwargs = pytree.tree_unflatten(micro, spec)
    with training_flags_kept(model), recording_ipus(refuse_ops_outside_blocks=True) as trace, \
            recording_module_blocks(model, trace) as module_blocks, \
            finding_recomputed_modules(model) as checkpointed, \
            torch.no_grad(), torch.random.fork_rng(devices=[]), weights_follow_activations(mixed_precision):  # fmt: skip
        device = weights_device(model)
        args, kwargs = pytree.tree_map(lambda t: as_fed(t, device, copy=True), (args, kwargs))
        model(*args, **kwargs)
    return Trace(list(trace), module_blocks, micro, spec, args, kwargs, checkpointed)


@contextlib.contextmanager
def training_flags_kept(model: nn.Module) -> Iterator[None]:
    """Every module of `model` leaves the block in the train/eval mode it entered in (a trace or a call
    switches them; the user's own `model.train()` / `model.eval()` stands)."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for module, was_training in modes:
            module.training = was_training


def constant_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Tensors held as plain attributes of the model's modules (neither parameters nor buffers)."""
    found: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                found[id(value)] = value
    return list(found.values())


@contextlib.contextmanager
def constants_as_traced(constants: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[None]:
    """While active, each constant (tensor, its value at compile) holds its compiled value, as on PopTorch;
    the host's own values are put back after."""
    with torch.no_grad():
        host = [(t, t.detach().clone()) for t, _ in constants]
        for t, traced in constants:
            t.copy_(traced)
    try:
        yield
    finally:
        with torch.no_grad():
            for t, value in host:
                t.copy_(value)
