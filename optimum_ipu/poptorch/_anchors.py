"""Anchored tensors: `opts.anchorTensor(short, long)`, `model.getTensorNames()`, `model.getAnchoredTensor(short)`.

PopTorch returns, besides the model's outputs, any tensor of the compiled graph a program names with
its PopART name. The ones programs anchor (Graphcore's "observing tensors" tutorial, the applications'
tests) are the weights and what the optimizer does to them, which is what is named here, per parameter
`name` of the model:

- `name`: the weight as the call ran it (inference; in training, as the update read it);
- `Gradient___name`: its gradient in the update, unscaled (with gradient accumulation, the gradient the
  update applies, summed or averaged over the micro-batches as the accumulation type says; over replicas,
  the all-reduced one);
- `UpdatedVar___name`: the weight after the update.

One value is recorded per weight update (per device iteration in training, per iteration in inference),
and the anchor's output mode picks among them as it picks outputs: `All` stacks them, `Sum` adds them,
`Final` keeps the last, `EveryN` every N-th; the default is the model's own output mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from optimum_ipu.poptorch._logging import Error
from optimum_ipu.poptorch.enums import OutputMode

GRADIENT, UPDATED = "Gradient___", "UpdatedVar___"


def tensor_names(model: nn.Module, training: bool) -> list[str]:
    """The tensors a program may anchor, for `getTensorNames()`."""
    names = [name for name, p in model.named_parameters() if p.requires_grad or not training]
    if not training:
        return names
    return [*names, *(GRADIENT + n for n in names), *(UPDATED + n for n in names)]


def check_anchors(anchors: dict[str, tuple], model: nn.Module, training: bool) -> None:
    """Every anchored name must be one this model has (PopART failed the compile otherwise)."""
    known = set(tensor_names(model, training))
    for short, (long, _, _) in anchors.items():
        if long not in known:
            kinds = f"a parameter name, {GRADIENT}<parameter> or {UPDATED}<parameter>" if training else (
                "a parameter name (an inference model has no gradients or updates)"
            )
            raise Error(
                f"anchorTensor({short!r}, {long!r}): the model has no tensor {long!r}. Anchor {kinds}; "
                "model.getTensorNames() lists them."
            )


class AnchorRecorder:
    """Collects the anchored tensors of one host call, one value per weight update (or iteration)."""

    def __init__(self, model: nn.Module, anchors: dict[str, tuple]):
        self.anchors = anchors
        self.parameters = dict(model.named_parameters())
        self.values: dict[str, list[torch.Tensor]] = {short: [] for short in anchors}

    def _parameter(self, long: str) -> tuple[str, nn.Parameter]:
        for kind in (GRADIENT, UPDATED):
            if long.startswith(kind):
                return kind, self.parameters[long[len(kind) :]]
        return "", self.parameters[long]

    def record_weights(self) -> None:
        """One inference iteration: the weights as it ran them."""
        for short, (long, _, _) in self.anchors.items():
            self.values[short].append(self._parameter(long)[1].detach().clone())

    @contextlib.contextmanager
    def around_updates(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """Record each update's gradients and weights (before) and updated weights (after) while it runs."""
        if not self.anchors:  # the usual case: no hooks on the optimizer
            yield
            return
        wanted = [(short, *self._parameter(long)) for short, (long, _, _) in self.anchors.items()]

        def before(_optimizer, args, kwargs):
            gradients = kwargs.get("gradients") or {}
            for short, kind, p in wanted:
                if kind == GRADIENT:
                    grad = gradients.get(p, p.grad)
                    self.values[short].append(torch.zeros_like(p) if grad is None else grad.detach().clone())
                elif kind == "":
                    self.values[short].append(p.detach().clone())

        def after(_optimizer, args, kwargs):
            for short, kind, p in wanted:
                if kind == UPDATED:
                    self.values[short].append(p.detach().clone())

        handles = [optimizer.register_step_pre_hook(before), optimizer.register_step_post_hook(after)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def results(self, default_mode: OutputMode, default_period: int) -> dict[str, torch.Tensor]:
        """Each anchor's values reduced by its output mode (the model's when it gave none)."""
        out = {}
        for short, (_, mode, period) in self.anchors.items():
            values = self.values[short]
            if not values:
                continue
            if mode is None:
                mode, period = default_mode, default_period
            out[short] = _select(values, mode, period)
        return out


def _select(values: list[torch.Tensor], mode: OutputMode, period: int) -> torch.Tensor:
    if mode in (OutputMode.All, OutputMode.Default):
        return torch.stack(values)
    if mode == OutputMode.Sum:
        return torch.stack(values).sum(0)
    if mode == OutputMode.Final:
        return values[-1]
    if mode == OutputMode.EveryN:
        chosen = values[period - 1 :: period]
        if not chosen:
            raise Error(f"OutputMode.EveryN with period {period} selects nothing of {len(values)} iterations.")
        return torch.stack(chosen)
    raise Error(f"Unknown output mode {mode!r} for an anchored tensor.")


def anchored(memory: dict[str, Any], short_name: str) -> torch.Tensor:
    """`getAnchoredTensor(short_name)`: PopTorch's assertion when nothing was recorded under that name."""
    if short_name not in memory:
        raise AssertionError("No tensor with name " + short_name + " found.")
    return memory[short_name]
