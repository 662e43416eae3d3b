"""The simulated IPU system under `IPUTrainer`'s training steps: what transformers' Trainer has no word for.

One trainer step is one host call. `TrainingCalls` holds what lasts from call to call: the loss
scaler and the replicas' random streams (saved and restored with the optimizer's state dict, so the
Trainer's own checkpoints carry them), this process's replicas or pipeline stage under torchrun, and
the `TrainingExecutable` built for the optimizer in use. The trainer hands it each combined batch
(`step`) and asks it, before a save or an evaluation, to give every process the state those read
(`gather_process_state`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from optimum_ipu.call_layout import CallLayout
from optimum_ipu.runtime.batches import move_to
from optimum_ipu.runtime.distributed import build_process_replicas
from optimum_ipu.runtime.executor import TrainingExecutable
from optimum_ipu.runtime.loss_scaling import LossScaler
from optimum_ipu.runtime.optimizers import LAMB, AdamW, IPUOptimizer, accumulator_dtype
from optimum_ipu.runtime.replicas import ReplicaStreams
from optimum_ipu.runtime.stages import PipelineStages, check_supported

logger = logging.getLogger(__name__)

__all__ = ["TrainingCalls", "ipu_optimizer"]

LossFn = Callable[[nn.Module, dict[str, Any]], torch.Tensor]


class TrainingCalls:
    """The host calls of one IPUTrainer's training.

    Args:
        pipelined: the trainer's `PipelinedModel` (its stages, when each stage is a process).
        ipu_config: the trainer's `IPUConfig` (in training mode).
        args: the trainer's `IPUTrainingArguments` (loss scaling, seed, clipping, device, fp32).
        fp16_compute: how fp16 ops are computed (None with `--fp32`).
        loss_fn: (model, micro-batch) -> loss: the trainer's `compute_loss`.
    """

    def __init__(self, pipelined, ipu_config, args, fp16_compute: str | None, loss_fn: LossFn):
        self.pipelined, self.ipu_config, self.args = pipelined, ipu_config, args
        self.fp16_compute, self.loss_fn = fp16_compute, loss_fn
        self.loss_scaler = LossScaler(args.loss_scaling or 1.0, auto=bool(ipu_config.auto_loss_scaling))
        self.replica_streams = ReplicaStreams(args.seed, ipu_config.replication_factor)
        # Under torchrun: this process's replicas (or pipeline stage); checked before any work.
        self.process_replicas = build_process_replicas(
            ipu_config.replication_factor, ipu_config.ipus_per_replica, args.device
        )
        if self.process_replicas is not None and self.process_replicas.layout.stages > 1:
            check_supported(pipelined)
        self.stages: PipelineStages | None = None
        self.executable: TrainingExecutable | None = None
        self._stale = False  # a step changed what `gather_process_state` gives every process

    # -- the optimizer ------------------------------------------------------------------------
    def carry_in(self, optimizer: torch.optim.Optimizer) -> None:
        """Save and restore the loss scaler and replica streams with `optimizer` (`optimizer.pt`).

        Uses torch's public optimizer state-dict hooks, so the Trainer's own checkpointing carries
        them; the executable reads the restored objects when it is built.
        """

        def save(_optimizer, state_dict):
            state_dict["ipu_run_state"] = {
                "loss_scaler": self.loss_scaler.state_dict(),
                "replica_streams": self.replica_streams.state_dict(),
            }
            return state_dict

        def load(_optimizer, state_dict):
            state_dict = dict(state_dict)
            run_state = state_dict.pop("ipu_run_state", None)
            if run_state is not None:
                self.loss_scaler.load_state_dict(run_state["loss_scaler"])
                self.replica_streams.load_state_dict(
                    run_state["replica_streams"], replicas_may_change=self.args.allow_batch_change_on_resume
                )
            return state_dict

        optimizer.register_state_dict_post_hook(save)
        optimizer.register_load_state_dict_pre_hook(load)

    # -- one step ---------------------------------------------------------------------------------
    def step(self, model: nn.Module, optimizer, inputs: dict[str, Any]) -> torch.Tensor:
        """One host call on the combined batch `inputs`; returns the mean micro-batch loss for logging.

        `model` is the unwrapped model (gradients are reduced by the executable, not DDP); the executable
        is built again when the optimizer changes.
        """
        inner = getattr(optimizer, "optimizer", optimizer)
        if self.executable is None or self.executable.optimizer is not inner:
            if not self.args.fp32 and not isinstance(inner, IPUOptimizer):
                raise TypeError(
                    f"fp16 weights need an IPU optimizer (fp32 math, stochastic rounding); got {type(inner).__name__} "
                    "from `optimizers=`. Pass optimum_ipu.runtime.optimizers.AdamW / LAMB, or train with --fp32."
                )
            self.executable = self._build_executable(model, optimizer)
        self.executable(move_to(inputs, self.args.device))
        self._stale = self.process_replicas is not None
        return self.executable.last_losses.nanmean().to(self.args.device)

    def _build_executable(self, model: nn.Module, optimizer) -> TrainingExecutable:
        return TrainingExecutable(
            model,
            CallLayout.from_ipu_config(self.ipu_config),
            loss_fn=lambda micro_batch: self.loss_fn(model, micro_batch),
            optimizer=optimizer,
            loss_scaler=self.loss_scaler,
            streams=self.replica_streams,
            max_grad_norm=self.args.max_grad_norm,
            fp16_compute=self.fp16_compute,
            replicas=self.process_replicas,
            stages=self._build_stages(),
            # The optimizer's gradient accumulator type (fp16 for fp16 training, see create_optimizer).
            accumulator_dtype=accumulator_dtype(optimizer),
        )

    def _build_stages(self) -> PipelineStages | None:
        """This process's pipeline stage when the stages are processes (see `runtime.distributed`)."""
        processes = self.process_replicas
        if processes is None or processes.layout.stages == 1:
            return None
        model = self.pipelined.module
        self.stages = PipelineStages(
            self.pipelined, stage=processes.stage, num_stages=processes.layout.stages, group=processes.pp_group,
            n_microbatches=self.ipu_config.gradient_accumulation_steps,
            loss_fn=lambda _stage_model, micro_batch: self.loss_fn(model, micro_batch),
            schedule="1f1b",  # the IPU's ramp-up / steady state / ramp-down order
        )  # fmt: skip
        return self.stages

    # -- between steps ------------------------------------------------------------------------------
    def gather_process_state(self, optimizer) -> None:
        """Give every process what rank 0 saves and what evaluation reads, when a step changed it.

        With one process per pipeline stage, each updates only its stage's weights and optimizer
        state; with replicas in several processes, each advances only its own replicas' random
        streams. Nothing reads them between saves and evaluations, so the steps pay for no exchange:
        the trainer's methods that save or evaluate call this first (not a callback reading the control
        flags, which an epoch-end save or a user's callback would bypass), and training ends with it.
        Every process runs the same steps and calls, so the collectives match.
        """
        if not self._stale:
            return
        self.process_replicas.share_streams(self.replica_streams)
        if self.stages is not None:
            self.stages.broadcast_weights()
            if optimizer is not None:
                self.stages.broadcast_optimizer_state(optimizer)
        self._stale = False

    def log_entries(self, logs: dict[str, float]) -> dict[str, float]:
        """What a training log adds: the executable's gradient norm in place of the Trainer's (which it
        measures after the executable has applied and released the gradients), the loss scale and the
        skipped updates."""
        own: dict[str, float] = {}
        if "loss" in logs and self.executable is not None:
            if self.executable.last_grad_norm is not None and "grad_norm" in logs:
                own["grad_norm"] = round(self.executable.last_grad_norm, 6)
            if not self.args.fp32 or self.args.loss_scaling:
                own["loss_scale"] = self.loss_scaler.scale
                own["skipped_updates"] = self.loss_scaler.skipped_updates
        return own


def ipu_optimizer(model: nn.Module, decay: set[str], args) -> IPUOptimizer:
    """The optimizer IPU training uses: AdamW (fp32 math on fp16 weights, stochastic rounding), or LAMB
    with `--lamb`, over two groups (the parameters named in `decay` get `args.weight_decay`).

    fp16 training keeps Optimum Graphcore's state types: the gradient accumulator and the first moment in
    fp16, the second moment in fp32 (its `create_optimizer` in 0.7); with `--fp32` every state is fp32.
    AdamW is built as that `create_optimizer` builds it, without Adam's bias correction (the moments used as
    they are); LAMB corrects unless `--lamb_no_bias_correction`.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    half = torch.float32 if args.fp32 else torch.float16
    common = dict(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), stochastic_rounding=not args.fp32,
                  seed=args.seed, accum_type=half, first_order_momentum_accum_type=half,
                  second_order_momentum_accum_type=torch.float32)  # fmt: skip
    if args.lamb:
        return LAMB(groups, eps=args.adam_epsilon, bias_correction=not args.lamb_no_bias_correction, **common)
    return AdamW(groups, eps=args.adam_epsilon, bias_correction=False, **common)
