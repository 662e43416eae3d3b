"""Loss scaling as on the IPU: scale the loss by S, reduce in fp32, unscale in fp32, skip overflows.

On the IPU every micro-batch's loss is multiplied by the loss scale S before backward, so fp16
gradients of small magnitude do not flush to zero; gradients are reduced over accumulation steps and
replicas (a mean), and the optimizer divides by S in fp32 before the update. Here the executable sums
each micro-batch's fp16 gradients into fp32 buffers and `LossScaler.unscale_` does the mean and the
division in one fp32 multiply, so no gradient representable at scale S is lost.

A non-finite gradient (an fp16 overflow in some backward) skips the update: the weights and the
optimizer state are untouched (`skip_non_finite=True`, IPUTrainer's rule, which Optimum Graphcore's and
transformers' users rely on). With `skip_non_finite=False` (PopTorch programs: the IPU's own behaviour,
with a static or an automatic scale) the update is applied as computed and the weights can become NaN;
an automatic scale still halves. The global gradient norm is measured only when something reads it
(clipping, the trainer's `grad_norm` log, as in transformers); otherwise one fused pass checks for
non-finite values and unscales, the way torch's `GradScaler` does.

With `auto=True` the scale adapts by the rule PopART documents for automatic loss scaling: after
each update, look at the gradients as the IPU stores them (fp16, still scaled, reduced); if more than
`threshold` of their elements lie above `bin_edge` x the fp16 maximum, halve S, otherwise double it
(every `update_period` updates); an overflow halves it at once. Scales stay powers of two (exact in
fp16 and fp32) between `min_scale` and `max_scale`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from optimum_ipu.runtime.gradients import global_norm
from optimum_ipu.runtime.replicas import LocalReplicas

logger = logging.getLogger(__name__)

FP16_MAX = 65504.0


def scaled_loss(loss: torch.Tensor, scale: float) -> torch.Tensor:
    """The loss a backward pass starts from: `loss × scale`, in fp32 (the loss itself when the scale is 1).

    The one rule of a micro-batch's backward, in one process (`LossScaler.scale_loss`) and on a
    pipeline's last stage process (`stages.StageRunner`).
    """
    return loss.float() if scale == 1.0 else loss.float() * scale


class LossScaler:
    """Static or automatic loss scaling for one training run.

    Args:
        initial_scale: S at the start (the fixed S for static scaling), > 0.
        auto: adapt S (`auto_loss_scaling`).
        update_period: adapt S every this many clean updates.
        bin_edge: the histogram's single bin edge, as a fraction of the fp16 maximum.
        threshold: the proportion of gradient elements above the edge that makes S shrink.
        min_scale, max_scale: bounds for automatic scaling.
    """

    def __init__(
        self,
        initial_scale: float = 1.0,
        auto: bool = False,
        *,
        update_period: int = 1,
        bin_edge: float = 1 / 8,
        threshold: float = 1e-7,
        min_scale: float = 1.0,
        max_scale: float = 2.0**15,
    ):
        if not initial_scale > 0:
            raise ValueError(
                f"loss_scaling must be > 0, got {initial_scale}; typical values are 64 to 32768."
            )
        self.initial_scale = float(initial_scale)
        self.scale = self.initial_scale
        self.auto = auto
        self.update_period = update_period
        self.bin_edge = bin_edge
        self.threshold = threshold
        self.min_scale = min_scale
        self.max_scale = max_scale
        self.clean_updates = 0
        self.skipped_updates = 0
        self.non_finite_updates = 0  # updates applied with non-finite gradients (skip_non_finite=False)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call `backward()` on: `loss × S`, in fp32 (`scaled_loss`)."""
        return scaled_loss(loss, self.scale)

    def unscale_(
        self,
        gradients: Sequence[torch.Tensor],
        micro_batches: int,
        replicas=None,
        *,
        norm: bool = True,
        skip_non_finite: bool = True,
    ) -> float | None:
        """Turn fp32 sums of scaled micro-batch gradients into mean true gradients, in place.

        Args:
            gradients: fp32 tensors, each the sum over `micro_batches` micro-batches of `S x grad`.
            micro_batches: accumulation steps x replicas, the mean's divisor.
            replicas: the replica group (`LocalReplicas` or a distributed one): an overflow on any
                process skips the update on all, and pipeline stages add their parts of the norm.
            norm: measure the global norm (for clipping and the logs). Without it, one fused pass
                checks and unscales, and a clean update returns NaN ("not measured").
            skip_non_finite: on a non-finite gradient, skip the update (IPUTrainer) or unscale it and
                let the caller apply it as computed (PopTorch, as on the IPU).

        Returns:
            The global L2 norm of the true mean gradient (NaN when `norm` is False; not finite for an
            update applied with a non-finite gradient), or None when an overflow skips the update (the
            caller drops the gradients).
        """
        replicas = replicas or LocalReplicas()
        divisor = self.scale * micro_batches
        if not norm and not self.auto:
            if replicas.any(_unscale_and_find_non_finite(gradients, 1.0 / divisor)):
                return self._skip_update() if skip_non_finite else self._apply_non_finite(math.nan)
            return math.nan
        squared = replicas.sum_over_stages(global_norm(gradients) ** 2)
        if replicas.any(not bool(squared.isfinite())):
            if skip_non_finite:
                return self._skip_update()
            torch._foreach_mul_(list(gradients), 1.0 / divisor)
            return self._apply_non_finite(float(squared.sqrt()) / divisor)
        if self.auto:
            above, total = replicas.sum_over_stages(
                self._counts_above_edge(gradients, micro_batches)
            ).tolist()
            self._after_clean_update(replicas.any(above / max(total, 1.0) > self.threshold))
        if gradients:
            torch._foreach_mul_(list(gradients), 1.0 / divisor)
        return float(squared.sqrt()) / divisor

    def _skip_update(self) -> None:
        """An overflow: count the skipped update, adapt the scale; the caller drops the gradients."""
        self.skipped_updates += 1
        self._after_overflow()

    def _apply_non_finite(self, norm: float) -> float:
        """A non-finite gradient whose update goes ahead (the IPU's behaviour): an automatic scale halves,
        as PopART's histogram counts the overflow above the edge; said once in the log."""
        self.non_finite_updates += 1
        if self.auto:
            self.scale = max(self.scale / 2, self.min_scale)
            self.clean_updates = 0
        if self.non_finite_updates == 1:
            logger.warning(
                "Non-finite gradients (loss scale %g): the update is applied as on the IPU, so the weights "
                "may now hold NaN or inf. Lower the loss scale or check the loss.",
                self.scale,
            )
        return norm

    def _counts_above_edge(self, gradients: Sequence[torch.Tensor], micro_batches: int) -> torch.Tensor:
        """[elements above the bin edge, all elements] of the stored (fp16, scaled, mean) gradients.

        Counts, not a proportion, so pipeline stages in separate processes can add theirs up.
        """
        edge = self.bin_edge * FP16_MAX * micro_batches  # compare the sums, not a divided copy
        above = sum(int((g.abs() >= edge).sum()) for g in gradients)
        return torch.tensor([float(above), float(sum(g.numel() for g in gradients))], dtype=torch.float64)

    def _after_clean_update(self, crowded: bool) -> None:
        self.clean_updates += 1
        if self.clean_updates % self.update_period:
            return
        new = min(self.scale * 2, self.max_scale) if not crowded else max(self.scale / 2, self.min_scale)
        if new != self.scale:
            logger.info("Automatic loss scaling: scale %g -> %g.", self.scale, new)
        self.scale = new

    def _after_overflow(self) -> None:
        if self.auto:
            new = max(self.scale / 2, self.min_scale)
            logger.warning("Gradient overflow: update skipped, loss scale %g -> %g.", self.scale, new)
            self.scale = new
            self.clean_updates = 0
        else:
            logger.warning(
                "Gradient overflow with static loss scale %g: update skipped. Lower --loss_scaling or use "
                "--auto_loss_scaling.",
                self.scale,
            )

    def state_dict(self) -> dict:
        return {
            "scale": self.scale,
            "clean_updates": self.clean_updates,
            "skipped_updates": self.skipped_updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.clean_updates = int(state["clean_updates"])
        self.skipped_updates = int(state["skipped_updates"])


def _unscale_and_find_non_finite(gradients: Sequence[torch.Tensor], factor: float) -> bool:
    """Multiply `gradients` by `factor` in place and say whether any element is NaN or infinite.

    One fused pass per device (torch's `_amp_foreach_non_finite_check_and_unscale_`, the kernel of
    `GradScaler.unscale_`): the product is the same fp32 multiply as `torch._foreach_mul_`.
    """
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for g in gradients:
        by_device.setdefault(g.device, []).append(g)
    found = False
    for device, tensors in by_device.items():
        flag = torch.zeros(1, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(
            tensors, flag, torch.full((1,), factor, device=device)
        )
        found = found or bool(flag.item())
    return found
