"""Gradients of one weight update: summed in the accumulator's type, clipped by their global norm.

On the IPU the gradients of every micro-batch of an update are reduced (over accumulation steps and
replicas) into a gradient accumulator before the optimizer sees them; its type is the optimizer's
`accum_type`. When an update has several micro-batches each one's gradient is added into the
accumulator the moment autograd produces it (a post-accumulate-grad hook, while the data is still in
cache) and `.grad` is released.

* fp32 accumulator (PopTorch's default, `--fp32`): nothing small is lost. An update of one
  micro-batch sums nothing: its fp16 `.grad` is read as it is at the update, exactly converted to
  fp32, with no hook (a Python call per weight per micro-batch costs more than a small model's
  step). fp32 parameters need no buffer: autograd already accumulates their `.grad` in fp32.
* fp16 accumulator (Optimum Graphcore's fp16 training, and `IPUTrainer`'s): the loss-scaled
  gradients are combined in fp16, each step rounded to the nearest fp16 (as every fp16 result of
  the forward and backward is here; the IPU rounds them stochastically when stochastic rounding is
  on). Under a Sum reduction they are summed, so a contribution below half an fp16 step of the
  running sum is lost and a sum beyond 65,504 overflows to inf, which the loss scaler then sees and
  skips. Under a Mean reduction (the default) PopTorch switches to PopART's running mean whenever
  the accumulator is fp16 (`MeanReductionStrategy.Running`, set from the optimizer's `accum_type`):
  after k micro-batches the accumulator holds a * acc + b * g with b = 1 / (k + 1), a = 1 - b,
  computed in fp32 and rounded to fp16 (here as acc + b * (g - acc), torch's `lerp`, one pass), which
  never exceeds the largest gradient, so it overflows only where one micro-batch's gradient does. One
  micro-batch's gradient is held in fp16 as it is.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch

from optimum_ipu.runtime.kept_tensors import kept_tensor
from optimum_ipu.runtime.rounding import chunk_views


class GradientAccumulator:
    """Sums of the micro-batch gradients of `params` over one update, in `dtype` (fp32 or fp16).

    `gradients()` hands them on as fp32 tensors (the values the accumulator holds): the reduction over
    processes, the unscaling and the update run in fp32. With `running_mean` (an fp16 accumulator under
    a Mean reduction: see the module's docstring) they are the means of the update's micro-batches
    rather than their sums, and `mean_over` says over how many, so the caller divides by the rest only.
    """

    def __init__(
        self, params: Sequence[torch.nn.Parameter], dtype: torch.dtype = torch.float32, running_mean: bool = False
    ):
        if dtype not in (torch.float32, torch.float16):
            raise ValueError(f"a gradient accumulator is torch.float32 or torch.float16, got {dtype}.")
        self.params = list(params)
        self.dtype = dtype
        self.running_mean = running_mean
        self.mean_over = 1  # micro-batches the handed-out gradients are already the mean of
        self._micro_batch: int | None = None
        # The weights whose gradients autograd cannot sum in the accumulator's type by itself.
        self._half = [p for p in self.params if p.dtype != torch.float32 or dtype != torch.float32]
        # The sums (in `dtype`) and their fp32 hand-outs, kept from one update to the next (`kept_tensors`);
        # a sum in `.grad`'s own type starts as the first micro-batch's `.grad` tensor itself, not a copy.
        # `_counts` names the sums this update has written (a buffer not in it holds a past update's
        # values) and how many micro-batches each holds; `_last`, the micro-batch each last took from.
        self._buffers: dict[torch.Tensor, torch.Tensor] = {}
        self._out: dict[torch.Tensor, torch.Tensor] = {}
        self._counts: dict[torch.Tensor, int] = {}
        self._last: dict[torch.Tensor, int | None] = {}
        self._scratch: torch.Tensor | None = None  # `_add_converted`'s memory (CPU)

    @contextlib.contextmanager
    def collecting(self, micro_batches: int) -> Iterator[None]:
        """Within this context, fp16 gradients flow into the fp32 buffers (hooks are removed on exit).

        An update starts from no gradient: a `.grad` left on a weight before the context (a backward the
        user ran on the host module, as a CPU reference loop does) is dropped, as the IPU's accumulators
        start at zero whatever the host holds.

        Args:
            micro_batches: how many backward passes the context holds for one update; with one,
                no buffer is needed and no hook is set.
        """
        self.clear()
        self._micro_batch = None
        self.mean_over = micro_batches if self.running_mean else 1
        hooked = self._half if micro_batches > 1 else ()
        handles = [p.register_post_accumulate_grad_hook(self._take) for p in hooked]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def micro_batch(self, index: int) -> None:
        """Say that the backward passes from here on are micro-batch `index`'s (the executor's loop).

        A weight's gradient can arrive in parts within one backward (a weight used in two segments of a
        reentrant `torch.utils.checkpoint`): told the micro-batch, the running mean adds the parts into
        one micro-batch's share. Untold (the pipeline stages' schedule), each arrival is a micro-batch.
        """
        self._micro_batch = index

    def _take(self, param: torch.Tensor) -> None:
        current, grad = self._micro_batch, param.grad
        count = self._counts.get(param)
        if count is None:  # the update's first micro-batch
            if grad.dtype == self.dtype and grad.shape == param.shape:
                self._buffers[param] = grad  # `.grad`'s own tensor, let go of below: kept without a copy
            else:
                kept_tensor(self._buffers, param, param.shape, self.dtype, param.device).copy_(grad)
            self._counts[param] = 1
        elif not self.running_mean:
            buffer = self._buffers[param]
            if grad.dtype != buffer.dtype and buffer.dtype == torch.float32 and grad.device.type == "cpu":
                self._add_converted(buffer, grad)
            else:
                buffer.add_(grad)  # in the buffer's type: rounded to fp16 in an fp16 accumulator
        elif current is not None and self._last[param] == current:  # another part of this micro-batch
            self._buffers[param].add_(grad, alpha=1.0 / count)  # computed in fp32, rounded once
        else:  # PopART's running mean: acc + b * (g - acc) computed in fp32 by torch's lerp, rounded once
            buffer, b = self._buffers[param], 1.0 / (count + 1)
            if grad.dtype == buffer.dtype:
                buffer.lerp_(grad, b)
            else:  # an fp32 weight's gradient: in the fp32 hand-out's memory, free until then
                scratch = kept_tensor(self._out, param, param.shape, torch.float32, param.device)
                buffer.copy_(scratch.copy_(buffer).lerp_(grad, b))
            self._counts[param] = count + 1
        self._last[param] = current
        param.grad = None

    def _add_converted(self, buffer: torch.Tensor, grad: torch.Tensor) -> None:
        """`buffer += grad` for an fp32 sum of an fp16 gradient on the CPU, the same values as `add_`.

        Torch's `add_` of mixed types converts the whole gradient into a fresh fp32 tensor first, at every
        micro-batch: weight-sized fresh memory, which is new pages from the kernel whenever the allocator has
        just handed its heap back. Here the gradient goes through a chunk of scratch memory the accumulator
        keeps (`chunk_views`' size, the hooks running one at a time), converted and added while in cache; a
        gradient laid out unlike its buffer (a transposed weight's) goes through scratch of its own size.
        """
        if grad.is_contiguous() and buffer.is_contiguous():
            chunks = list(zip(chunk_views(buffer), chunk_views(grad)))
        else:
            chunks = [(buffer, grad)]
        largest = max((part.numel() for _, part in chunks), default=0)
        if self._scratch is None or self._scratch.numel() < largest:
            self._scratch = torch.empty(largest, dtype=torch.float32)
        for total, part in chunks:
            total.add_(self._scratch[: part.numel()].view(part.shape).copy_(part))

    def gradients(self) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        """(parameter, fp32 gradient sum) for every parameter that received a gradient."""
        out, sources, targets = [], [], []
        for p in self.params:
            if p in self._counts:
                grad = self._buffers[p]
            elif p.grad is not None:
                # An update of one micro-batch: `.grad` as the accumulator holds it (fp32: `.grad` itself;
                # an fp16 `.grad` converted exactly; fp32 in an fp16 accumulator: rounded).
                grad = p.grad if p.grad.dtype == torch.float16 else p.grad.to(self.dtype)
            else:
                continue
            if grad.dtype != torch.float32:  # an fp16 sum, handed out as its exact fp32 value
                sources.append(grad)
                grad = kept_tensor(self._out, p, grad.shape, torch.float32, p.device)
                targets.append(grad)
            if p.dtype == torch.float32:
                p.grad = grad  # an fp32 weight's optimizer reads `.grad`: the sum as the accumulator holds it
            out.append((p, grad))
        if targets:
            torch._foreach_copy_(targets, sources)  # one pass for every fp16 sum
        if self.mean_over > 1:
            # A weight that some micro-batches left without a gradient: their zeros join its mean, as
            # on the IPU, where every micro-batch produces every gradient.
            for p, grad in out:
                taken = self._counts.get(p, 1)
                if taken < self.mean_over:
                    grad.mul_(taken / self.mean_over)
        return out

    def hold_(self, gradients: Sequence[torch.Tensor]) -> None:
        """Round fp32 `gradients` (sums reduced over processes) to the values the accumulator holds: the
        IPU's all-reduce of fp16 accumulators gives an fp16 sum. Nothing to do for an fp32 accumulator."""
        if self.dtype == torch.float16 and gradients:
            torch._foreach_copy_(list(gradients), [g.half() for g in gradients])

    def clear(self) -> None:
        """Drop every gradient (after an update, or to skip one); the buffers are kept for the next update."""
        self._counts = {}
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
