"""IPU numerics on a host device: half precision, stochastic rounding and loss scaling.

Training on an IPU defaults to fp16 weights and activations. Two mechanisms keep that trainable, and
both are reproduced here:

- *Stochastic rounding*: an fp32 result written to fp16 rounds up or down at random, with the
  probability of each proportional to the distance, so small updates survive on average instead of
  being rounded away.
- *Loss scaling*: the loss is multiplied by S before backward so fp16 gradients do not underflow,
  and gradients are divided by S before the update. Static scaling keeps S fixed; automatic scaling
  halves S and skips the update when a gradient overflows and doubles it after a run of clean steps.
  Either way, a non-finite gradient never reaches the weights.

The loss scaler keeps its state in the optimizer's param groups (as PopTorch optimizers carry
`loss_scaling`), so it is saved in and restored from `optimizer.pt` with everything else.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

logger = logging.getLogger(__name__)

# fp32 has 23 explicit mantissa bits, fp16 has 10: 13 bits are dropped when rounding to half.
_DROPPED_BITS = 13
_DROPPED_MASK = (1 << _DROPPED_BITS) - 1


def stochastic_round_to_half(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round an fp32 tensor to fp16, up or down at random in proportion to the distance.

    Random bits are added below the fp16 mantissa and then cut off, so E[result] == x for values in
    fp16's normal range. Works on the sign-magnitude bit pattern, hence for both signs. The noise
    cannot reach the exponent bits of an infinity (its low 13 bits are zero) nor of a NaN with the
    quiet bit set (every NaN torch produces), so non-finite values pass through unchanged.
    """
    x = x.float().contiguous()
    n = x.numel()
    # One 31-bit draw gives two 16-bit halves; 13 bits of each are the noise (half the generator calls).
    words = torch.empty((n + 1) // 2, dtype=torch.int32, device=x.device).random_(generator=generator)
    noise = words.view(torch.int16)[:n].view(x.shape).bitwise_and(_DROPPED_MASK)
    rounded = (x.view(torch.int32) + noise).bitwise_and_(~_DROPPED_MASK)
    return rounded.view(torch.float32).half()


def write_back(param: torch.Tensor, value: torch.Tensor, stochastic_rounding: bool) -> None:
    """Store an fp32 `value` into `param`, with stochastic rounding when `param` is fp16."""
    if param.dtype == torch.float16 and stochastic_rounding:
        param.copy_(stochastic_round_to_half(value))
    else:
        param.copy_(value)


def grads_are_finite(params: Iterable[torch.Tensor]) -> bool:
    """True when no gradient holds an inf or a NaN (one fused pass, one host sync for all of them).

    A tensor's L2 norm is inf or NaN when it holds one, and torch computes all the norms in one
    foreach kernel. Accumulated in fp32, finite fp16 gradients cannot overflow it; an fp32 gradient
    would need elements beyond ~1e19, and is then treated as an overflow too.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return True
    norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
    return bool(torch.stack([n.to(norms[0].device) for n in norms]).isfinite().all())


class LossScaler:
    """Static or automatic loss scaling whose state lives in `optimizer.param_groups`.

    Args:
        optimizer: the optimizer whose groups carry the scale (`loss_scaling`) and, for automatic
            scaling, the count of clean steps since the last change (`loss_scaling_clean_steps`).
        initial_scale: the starting (or, for static scaling, the fixed) scale.
        auto: adapt the scale (PopTorch's `auto_loss_scaling`).
        growth_interval: clean updates before an automatic scale doubles.
        max_scale: the automatic scale never grows past this (fp16 max is 65504).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_scale: float = 1.0,
        auto: bool = False,
        growth_interval: int = 1000,
        max_scale: float = 2.0**15,
    ):
        if initial_scale <= 0:
            raise ValueError(f"loss_scaling must be > 0, got {initial_scale}; typical values are 64 to 32768.")
        self.optimizer = optimizer
        self.auto = auto
        self.growth_interval = growth_interval
        self.max_scale = max_scale
        self.skipped_updates = 0
        for group in optimizer.param_groups:
            # A resumed optimizer already carries the scale it reached: keep it.
            group.setdefault("loss_scaling", float(initial_scale))
            group.setdefault("loss_scaling_clean_steps", 0)

    @property
    def scale(self) -> float:
        return float(self.optimizer.param_groups[0]["loss_scaling"])

    def _set(self, scale: float, clean_steps: int) -> None:
        for group in self.optimizer.param_groups:
            group["loss_scaling"] = scale
            group["loss_scaling_clean_steps"] = clean_steps

    def unscale_and_check(self, params: list[torch.Tensor]) -> bool:
        """Divide gradients by the scale; return False (and adapt the scale) if any is non-finite.

        On False every gradient is dropped (`.grad = None`), so a following `optimizer.step()`
        leaves the weights and optimizer state untouched.
        """
        scale = self.scale
        if scale != 1.0:
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                torch._foreach_mul_(grads, 1.0 / scale)
        if grads_are_finite(params):
            if self.auto:
                clean = int(self.optimizer.param_groups[0]["loss_scaling_clean_steps"]) + 1
                if clean >= self.growth_interval and scale * 2 <= self.max_scale:
                    logger.info("Automatic loss scaling: %d clean updates, scale %g -> %g.", clean, scale, scale * 2)
                    self._set(scale * 2, 0)
                else:
                    self._set(scale, clean)
            return True

        for p in params:
            p.grad = None
        self.skipped_updates += 1
        if self.auto:
            new_scale = max(scale / 2, 1.0)
            logger.warning("Gradient overflow: update skipped, loss scale %g -> %g.", scale, new_scale)
            self._set(new_scale, 0)
        else:
            logger.warning(
                "Gradient overflow with static loss scale %g: update skipped. Lower --loss_scaling or use "
                "--auto_loss_scaling.",
                scale,
            )
        return False
