"""IPU optimizers: AdamW and LAMB that update fp16 weights through fp32 arithmetic.

PopTorch's optimizers run on the device next to fp16 weights. Their update is computed in fp32, the
moments ("accumulators") are kept in fp32 or fp16 (`accum_type`), and the new weight is written back
to fp16 with stochastic rounding. These classes do the same on the host. On fp32 parameters the
AdamW update is the standard decoupled-weight-decay rule (Loshchilov & Hutter), and LAMB is the
layer-wise trust-ratio rule of You et al. (2019).

Parameters with `grad is None` are skipped entirely, which is how a loss-scaling overflow skips an
update.
"""

from __future__ import annotations

import math

import torch
from torch.optim.adamw import adamw

from optimum_ipu.runtime.precision import write_back


class _IPUOptimizer(torch.optim.Optimizer):
    """Shared state handling: fp32 working copies, accumulator dtype, write-back rounding."""

    def __init__(self, params, defaults: dict):
        if defaults["lr"] < 0:
            raise ValueError(f"Invalid learning rate: {defaults['lr']}")
        beta1, beta2 = defaults["betas"]
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"Invalid betas {defaults['betas']}: each must be in [0, 1).")
        super().__init__(params, defaults)

    def _state(self, p: torch.Tensor, accum_dtype: torch.dtype) -> dict:
        """`p`'s step count and two moments (in `accum_dtype`), created on its first update."""
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, dtype=accum_dtype, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=accum_dtype, memory_format=torch.preserve_format)
        return state

    def _moments(self, p: torch.Tensor, accum_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, int]:
        state = self._state(p, accum_dtype)
        state["step"] += 1
        return state["exp_avg"], state["exp_avg_sq"], int(state["step"].item())

    @staticmethod
    def _update_moments(exp_avg, exp_avg_sq, grad32, beta1, beta2):
        m = exp_avg.float().mul_(beta1).add_(grad32, alpha=1 - beta1)
        v = exp_avg_sq.float().mul_(beta2).addcmul_(grad32, grad32, value=1 - beta2)
        exp_avg.copy_(m)
        exp_avg_sq.copy_(v)
        return m, v


class AdamW(_IPUOptimizer):
    """AdamW with fp32 math on fp16 (or fp32) parameters.

    Args:
        params: parameters or param groups.
        lr, betas, eps, weight_decay: as `torch.optim.AdamW`.
        bias_correction: apply Adam's bias correction.
        accum_type: dtype of the two moments (torch.float32 or torch.float16).
        stochastic_rounding: round fp16 weight writes stochastically (the IPU training default).
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        bias_correction: bool = True,
        accum_type: torch.dtype = torch.float32,
        stochastic_rounding: bool = True,
    ):
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
            accum_type=accum_type, stochastic_rounding=stochastic_rounding,
        )  # fmt: skip
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if group["bias_correction"]:
                self._fused_step(group, params)
            else:
                for p in params:
                    self._step_one(group, p)
        return loss

    def _fused_step(self, group: dict, params: list[torch.Tensor]) -> None:
        """All of a group's tensors through torch's fused AdamW kernel, on fp32 working copies.

        Working copies are exact (`p.float()`), so this is the same update as `_step_one`, at the speed
        of one fused pass instead of a dozen elementwise ones.
        """
        beta1, beta2 = group["betas"]
        weights, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in params:
            state = self._state(p, group["accum_type"])
            weights.append(p.float())  # p itself when p is fp32: updated in place
            grads.append(p.grad.float())
            exp_avgs.append(state["exp_avg"].float())
            exp_avg_sqs.append(state["exp_avg_sq"].float())
            steps.append(state["step"])
        adamw(
            weights, grads, exp_avgs, exp_avg_sqs, [], steps, fused=weights[0].device.type in ("cpu", "cuda"),
            amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
            eps=group["eps"], maximize=False,
        )  # fmt: skip
        for p, weight, m, v in zip(params, weights, exp_avgs, exp_avg_sqs):
            state = self.state[p]
            if state["exp_avg"] is not m:  # fp16 accumulators: store the fp32 result back
                state["exp_avg"].copy_(m)
                state["exp_avg_sq"].copy_(v)
            if weight is not p:
                write_back(p, weight, group["stochastic_rounding"])

    def _step_one(self, group: dict, p: torch.Tensor) -> None:
        """One tensor, written out: the reference rule (and the only one without bias correction)."""
        beta1, beta2 = group["betas"]
        grad = p.grad.float()
        exp_avg, exp_avg_sq, step = self._moments(p, group["accum_type"])
        m, v = self._update_moments(exp_avg, exp_avg_sq, grad, beta1, beta2)
        c1 = 1 - beta1**step if group["bias_correction"] else 1.0
        c2 = 1 - beta2**step if group["bias_correction"] else 1.0
        weight = p.float()
        weight.mul_(1 - group["lr"] * group["weight_decay"])
        denom = (v.sqrt() / math.sqrt(c2)).add_(group["eps"])
        weight.addcdiv_(m, denom, value=-group["lr"] / c1)
        write_back(p, weight, group["stochastic_rounding"])


class LAMB(_IPUOptimizer):
    """LAMB: Adam's direction scaled per tensor by the trust ratio ||w|| / ||update||.

    Args:
        params, lr, betas, eps, weight_decay: as AdamW.
        bias_correction: False gives `--lamb_no_bias_correction`.
        max_weight_norm: clip ||w|| in the trust ratio (None: no clipping).
        accum_type, stochastic_rounding: as AdamW.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        bias_correction: bool = True,
        max_weight_norm: float | None = None,
        accum_type: torch.dtype = torch.float32,
        stochastic_rounding: bool = True,
    ):
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
            max_weight_norm=max_weight_norm, accum_type=accum_type, stochastic_rounding=stochastic_rounding,
        )  # fmt: skip
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.float()
                exp_avg, exp_avg_sq, step = self._moments(p, group["accum_type"])
                m, v = self._update_moments(exp_avg, exp_avg_sq, grad, beta1, beta2)
                if group["bias_correction"]:
                    m = m / (1 - beta1**step)
                    v = v / (1 - beta2**step)
                weight = p.float()
                update = m / (v.sqrt() + group["eps"]) + group["weight_decay"] * weight
                w_norm = weight.norm()
                if group["max_weight_norm"] is not None:
                    w_norm = w_norm.clamp(max=group["max_weight_norm"])
                u_norm = update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                weight.sub_(update * (group["lr"] * trust))
                write_back(p, weight, group["stochastic_rounding"])
        return loss
