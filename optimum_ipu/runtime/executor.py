"""Executables: what one host call does on the simulated IPU system.

A training call consumes one *combined batch* of micro_batch x GA x replicas x device_iterations
samples, laid out as [device iteration][replica][accumulation step][micro-batch]. Every replica
runs its GA micro-batches through the pipeline (the pipeline's micro-batches *are* the accumulation
micro-batches); gradients are reduced over accumulation steps and replicas (a mean by default, as
PopTorch's `accumulationAndReplicationReductionType`), unscaled, checked for overflow, and the
optimizer steps once per device iteration. The last device iteration's update is left to the
caller (IPUTrainer), so the trainer's gradient clipping, optimizer step and LR schedule run as in
transformers; within one call every update uses the same learning rate, as on the IPU.

Replicas are simulated in one process, one after another on the same weights: the math is that of
r data-parallel copies followed by an all-reduce. Inference runs sharded: one forward over the
whole batch, the stages one after another, no accumulation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from optimum_ipu.runtime.checks import micro_batch_size_of
from optimum_ipu.runtime.precision import LossScaler

OUTPUT_MODES = ("final", "all", "sum", "default")


def cast_floating(batch: Mapping[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """Cast floating tensors (pixel values, float labels) to the model's dtype; leave ids alone."""
    return {
        k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != dtype else v
        for k, v in batch.items()
    }


def split_batch(batch: Mapping[str, Any], parts: int) -> list[dict[str, Any]]:
    """Split every tensor of `batch` into `parts` equal chunks along dim 0 (other values are shared)."""
    chunks: list[dict[str, Any]] = [{} for _ in range(parts)]
    for key, value in batch.items():
        pieces = value.chunk(parts, dim=0) if isinstance(value, torch.Tensor) and value.dim() > 0 else [value] * parts
        for chunk, piece in zip(chunks, pieces):
            chunk[key] = piece
    return chunks


def batch_size_of(batch: Mapping[str, Any]) -> int:
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    raise ValueError(f"the batch has no tensor with a batch dimension (keys: {sorted(batch)}).")


class TrainingExecutable:
    """One host call = one combined batch: forward, backward, reductions and all but the last update.

    Args:
        model: the (parallelized) model.
        ipu_config: its `IPUConfig` in training mode.
        loss_fn: micro-batch -> scalar loss (IPUTrainer passes its `compute_loss`).
        optimizer: stepped for every device iteration but the last.
        loss_scaler: the `LossScaler` (static or automatic).
        max_grad_norm: clip gradients before the inner updates (0 disables), as the trainer does.
        reduction: "mean" or "sum" over accumulation steps and replicas.
    """

    def __init__(
        self,
        model: nn.Module,
        ipu_config,
        loss_fn: Callable[[dict[str, Any]], torch.Tensor],
        optimizer: torch.optim.Optimizer,
        loss_scaler: LossScaler,
        max_grad_norm: float = 0.0,
        reduction: str = "mean",
    ):
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}.")
        if ipu_config.output_mode not in OUTPUT_MODES:
            raise ValueError(f"output_mode must be one of {OUTPUT_MODES}, got {ipu_config.output_mode!r}.")
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.loss_scaler = loss_scaler
        self.max_grad_norm = max_grad_norm
        self.reduction = reduction
        self.device_iterations = ipu_config.device_iterations
        self.replication_factor = ipu_config.replication_factor
        self.gradient_accumulation_steps = ipu_config.gradient_accumulation_steps
        self.output_mode = ipu_config.output_mode
        self.dtype = next(model.parameters()).dtype
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.last_update_applied = True

    def _losses_to_return(self, losses: torch.Tensor) -> torch.Tensor:
        """losses[d, r, g] -> what PopTorch returns for the output mode."""
        if self.output_mode == "all":
            return losses
        if self.output_mode == "sum":
            return losses.sum(dim=2)
        return losses[:, :, -1]  # "final" and training's "default": the last micro-batch per replica

    def __call__(self, batch: Mapping[str, Any]) -> torch.Tensor:
        di, replicas, ga = self.device_iterations, self.replication_factor, self.gradient_accumulation_steps
        micro_batch_size_of(batch_size_of(batch), di, replicas, ga)  # raises "Invalid batch dimension"
        micro_batches = split_batch(cast_floating(batch, self.dtype), di * replicas * ga)
        divisor = replicas * ga if self.reduction == "mean" else 1
        losses = torch.empty(di, replicas, ga)

        self.model.train()
        for d in range(di):
            scale = self.loss_scaler.scale
            for r in range(replicas):
                for g in range(ga):
                    loss = self.loss_fn(micro_batches[(d * replicas + r) * ga + g])
                    (loss.float() * (scale / divisor)).backward()
                    losses[d, r, g] = loss.detach().float()
            self.last_update_applied = self.loss_scaler.unscale_and_check(self.params)
            if d < di - 1:
                if self.last_update_applied:
                    if self.max_grad_norm and self.max_grad_norm > 0:
                        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
                    self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        self.last_losses = losses
        return self._losses_to_return(losses)


class InferenceExecutable:
    """Sharded inference: the whole (possibly short) batch through the stages, without gradients."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.dtype = next(model.parameters()).dtype

    @torch.no_grad()
    def __call__(self, batch: Mapping[str, Any]):
        self.model.eval()
        return self.model(**cast_floating(batch, self.dtype))
