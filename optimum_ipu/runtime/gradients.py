"""Gradients of one weight update: accumulated in fp32, clipped by their global norm.

On the IPU the gradients of every micro-batch of an update are reduced (over accumulation steps and
replicas) before the optimizer sees them. fp16 gradients summed in fp16 lose small contributions
and can overflow, so when an update has several micro-batches each one's fp16 gradient is added
into an fp32 buffer the moment autograd produces it (a post-accumulate-grad hook, while the data is
still in cache) and `.grad` is released. An update of one micro-batch sums nothing: its fp16
`.grad` is read as it is at the update, exactly converted to fp32, with no hook (a Python call per
weight per micro-batch costs more than a small model's step). fp32 parameters need no buffer:
autograd already accumulates their `.grad` in fp32.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch


class GradientAccumulator:
    """fp32 sums of the micro-batch gradients of `params` over one update."""

    def __init__(self, params: Sequence[torch.nn.Parameter]):
        self.params = list(params)
        self._half = [p for p in self.params if p.dtype != torch.float32]
        self._buffers: dict[torch.Tensor, torch.Tensor] = {}

    @contextlib.contextmanager
    def collecting(self, micro_batches: int) -> Iterator[None]:
        """Within this context, fp16 gradients flow into the fp32 buffers (hooks are removed on exit).

        Args:
            micro_batches: how many backward passes the context holds for one update; with one,
                no buffer is needed and no hook is set.
        """
        hooked = self._half if micro_batches > 1 else ()
        handles = [p.register_post_accumulate_grad_hook(self._take) for p in hooked]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _take(self, param: torch.Tensor) -> None:
        buffer = self._buffers.get(param)
        if buffer is None:
            self._buffers[param] = param.grad.float()
        else:
            buffer.add_(param.grad)
        param.grad = None

    def gradients(self) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        """(parameter, fp32 gradient sum) for every parameter that received a gradient."""
        out = []
        for p in self.params:
            grad = self._buffers.get(p)
            if grad is None and p.grad is not None:
                # fp32: `.grad` itself (float() returns it); fp16 in an update of one micro-batch: converted
                grad = p.grad.float()
            if grad is not None:
                out.append((p, grad))
        return out

    def clear(self) -> None:
        """Drop every gradient (after an update, or to skip one)."""
        self._buffers = {}
        for p in self.params:
            p.grad = None


def global_norm(gradients: Sequence[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all `gradients` together, computed in fp32."""
    if not gradients:
        return torch.zeros(())
    norms = torch._foreach_norm(list(gradients), 2, dtype=torch.float32)
    return torch.stack([n.to(norms[0].device) for n in norms]).norm()


def clip_(gradients: Sequence[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """Scale `gradients` in place so their global `norm` is at most `max_norm` (torch's rule)."""
    if max_norm and max_norm > 0 and math.isfinite(float(norm)):
        coefficient = min(max_norm / (float(norm) + 1e-6), 1.0)
        if coefficient < 1.0:
            torch._foreach_mul_(list(gradients), coefficient)
