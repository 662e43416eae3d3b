"""Executables: what one host call does on the simulated IPU system.

A training call consumes one *combined batch* of micro_batch x GA x replicas x device_iterations
samples, laid out as [device iteration][replica][accumulation step][micro-batch]. For every device
iteration, each replica runs its GA micro-batches through the pipeline (the pipeline's micro-batches
*are* the accumulation micro-batches) with the loss scaled by S, in its own random stream; the
gradients are summed in fp32, reduced over replicas, divided by S x replicas x GA (PopTorch's mean
reduction) in fp32, checked for overflow, clipped by their global norm, and the optimizer steps.
Every update of the call uses the same learning rate, as within one PopTorch call; the executable
leaves no gradient behind, so the Trainer's own clip and step that follow find nothing to do and
only its LR schedule advances.

Replicas run in this process one after another on the same weights (`LocalReplicas`), or a slice
of them per process with `torch.distributed` (see `distributed.py`), and a replica's pipeline runs
in this process stage after stage, or with one process per stage (`stages.py`): the math is the same.

Inference runs sharded, as the IPU does: for every device iteration and replica, one micro-batch
through the stages one after another; outputs are put back together, and the loss of an evaluation
batch counts real samples only (padding repeated by `pad_on_batch_axis` is left out).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from optimum_ipu.call_layout import CallLayout
from optimum_ipu.runtime.batches import batch_size_of, cast_floating, concatenate, slice_batch, split_batch
from optimum_ipu.runtime.fp16_compute import fp16_compute_context, fp32_memory_of_updates
from optimum_ipu.runtime.gradients import GradientAccumulator, clip_
from optimum_ipu.runtime.loss_scaling import LossScaler
from optimum_ipu.runtime.optimizers import fp32_working_copies, keeps_running_mean, takes_fp32_gradients
from optimum_ipu.runtime.replicas import LocalReplicas, Replicas, ReplicaStreams


class TrainingExecutable:
    """One host call = one combined batch: forward, backward, reductions and every weight update.

    Args:
        model: the (parallelized) model.
        layout: the call's `CallLayout` (device iterations, replicas, accumulation); kept as `layout`.
        loss_fn: micro-batch -> scalar loss (IPUTrainer passes its `compute_loss`).
        optimizer: stepped once per device iteration (an IPU optimizer when weights are fp16).
        loss_scaler: the `LossScaler` (static or automatic).
        streams: one random stream per replica (dropout differs between replicas).
        max_grad_norm: clip the global gradient norm before each update (0 disables).
        fp16_compute: "emulated" (fp32 partials) or "native" fp16 kernels.
        replicas: which replicas run here and how they reduce (`LocalReplicas` by default).
        stages: this process's `PipelineStages` when each pipeline stage is a process: a replica's
            accumulation micro-batches then run through the stages concurrently.
        reduction: "mean" (PopTorch's default: the update uses the mean gradient over accumulation
            steps and replicas) or "sum" (their sum: PopTorch's `ReductionType.Sum`).
        measure_grad_norm: measure the global gradient norm at every update, into `last_grad_norm`
            (IPUTrainer logs it, as transformers' Trainer does). Without it (PopTorch returns no
            norm) the norm is measured only to clip, and the overflow check and the unscaling are one
            fused pass.
        accumulator_dtype: the gradient accumulator's type (`gradients.GradientAccumulator`): fp32, or
            fp16 as Optimum Graphcore's fp16 training combines the loss-scaled micro-batch gradients
            (under a Mean reduction as PopTorch's running mean, as it does for an fp16 `accum_type`).
        skip_non_finite_updates: skip an update whose gradients are not finite (IPUTrainer, the
            default: Optimum Graphcore's and transformers' users rely on it), or apply it as computed, the
            weights becoming NaN as on the IPU (PopTorch programs; `LossScaler.unscale_`).
        stochastic_rounding: write fp16 weights back with stochastic rounding (from
            `rounding_generator`) when the optimizer is a torch optimizer updating them through fp32
            working copies (`optimizers.fp32_working_copies`); an IPU optimizer
            (`step(gradients=...)`) rounds by its own setting.
        cast_inputs: cast floating inputs to the model's dtype (IPUTrainer); False: the caller feeds them
            as the model takes them (PopTorch, by the IPU's type rules: `poptorch._ipu_types`).
        sets_mode: put the model in train mode for the call (IPUTrainer, as transformers' Trainer does);
            False: each module runs in the train/eval mode its user left it in (PopTorch, which never
            calls `train()` or `eval()`: a BatchNorm frozen with `.eval()` stays frozen).
    """

    def __init__(
        self,
        model: nn.Module,
        layout: CallLayout,
        loss_fn: Callable[[dict[str, Any]], torch.Tensor],
        optimizer: torch.optim.Optimizer,
        loss_scaler: LossScaler,
        streams: ReplicaStreams,
        *,
        max_grad_norm: float = 0.0,
        fp16_compute: str = "emulated",
        replicas: Replicas | None = None,
        stages=None,
        reduction: str = "mean",
        measure_grad_norm: bool = True,
        accumulator_dtype: torch.dtype = torch.float32,
        stochastic_rounding: bool = False,
        rounding_generator: torch.Generator | None = None,
        skip_non_finite_updates: bool = True,
        cast_inputs: bool = True,
        sets_mode: bool = True,
    ):
        if not isinstance(layout, CallLayout):
            raise TypeError(f"TrainingExecutable takes a CallLayout, got {type(layout).__name__}.")
        self.gradient_divisor = layout.gradient_divisor(reduction)  # raises for a reduction not mean / sum
        self.model = model
        self.loss_fn = loss_fn
        self.streams = streams
        self.fp16_compute = fp16_compute
        self.replicas = replicas or LocalReplicas()
        self.stages = stages
        self.reduction = reduction
        self.measure_grad_norm = measure_grad_norm
        self.skip_non_finite_updates = skip_non_finite_updates
        self.layout = layout
        self.dtype = next(model.parameters()).dtype if cast_inputs else None
        self.sets_mode = sets_mode
        # Walked once: a walk of the module tree per update costs more than a small model's step.
        self.weights = list(model.parameters())
        self.last_losses = torch.empty(0)
        self.last_grad_norm: float | None = None
        self.last_update_applied = True
        self.use_optimizer(
            optimizer, loss_scaler, max_grad_norm=max_grad_norm, accumulator_dtype=accumulator_dtype,
            stochastic_rounding=stochastic_rounding, rounding_generator=rounding_generator,
        )  # fmt: skip

    def use_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        loss_scaler: LossScaler,
        *,
        max_grad_norm: float = 0.0,
        accumulator_dtype: torch.dtype = torch.float32,
        stochastic_rounding: bool = False,
        rounding_generator: torch.Generator | None = None,
    ) -> None:
        """Take `optimizer` and the settings that go with it from the next call on (see `__init__`).

        Compile and PopTorch's `setOptimizer` both come here, so a new optimizer's loss scale, clipping
        norm, accumulator type and rounding are all in force together, never some of them.
        """
        self.optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper -> the optimizer
        self.loss_scaler = loss_scaler
        self.max_grad_norm = max_grad_norm
        self.stochastic_rounding = stochastic_rounding
        self.rounding_generator = rounding_generator
        trained = [p for p in self.weights if p.requires_grad]
        running_mean = self.reduction == "mean" and keeps_running_mean(self.optimizer, accumulator_dtype)
        current = getattr(self, "gradients", None)
        if current is None or (current.dtype, current.running_mean) != (accumulator_dtype, running_mean):
            self.gradients = GradientAccumulator(trained, accumulator_dtype, running_mean)

    def __call__(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """Run one combined batch; return every micro-batch's loss as losses[iteration, replica, step]
        (also kept as `last_losses`; each front end picks what it reports)."""
        layout = self.layout
        di, replicas, ga = layout.device_iterations, layout.replication_factor, layout.gradient_accumulation_steps
        layout.micro_batch_size(batch_size_of(batch))  # raises "Invalid batch dimension"
        if self.dtype is not None:
            batch = cast_floating(batch, self.dtype)
        micro_batches = split_batch(batch, layout.micro_batches)
        local = self.replicas.local_replicas(replicas)
        # Every micro-batch's loss, in [device iteration][local replica][accumulation step] order:
        # 0-dim tensors on the model's device (one copy to the host at the end, not one per loss),
        # or, when the stages are processes, each replica's GA losses as one host vector.
        collected: list[torch.Tensor] = []

        if self.sets_mode:
            self.model.train()
        # The weights stay the same until each update: with several micro-batches before it, fp16 compute
        # converts them once (with one, each op's own conversion is the cheaper), from the second device
        # iteration on into the memory of the last update's fp32 working copies.
        per_update = layout.with_replicas(len(local)).micro_batches_per_update  # this process's, per update
        shared = self.weights if per_update > 1 else ()
        lends = self.fp16_compute == "emulated" and per_update > 1 and di > 1
        with fp32_memory_of_updates() if lends else contextlib.nullcontext():
            for d in range(di):
                with self.gradients.collecting(per_update), fp16_compute_context(self.fp16_compute, shared):
                    for r in local:
                        first = layout.first_micro_batch(d, r)
                        with self.streams.use(r):
                            if self.stages is not None:
                                collected.append(
                                    self.stages.run(micro_batches[first : first + ga], self.loss_scaler.scale)
                                )
                                continue
                            for g in range(ga):
                                loss = self.loss_fn(micro_batches[first + g])
                                self.gradients.micro_batch(first + g)
                                self.loss_scaler.scale_loss(loss).backward()
                                collected.append(loss.detach())
                self._update(self.gradient_divisor // self.gradients.mean_over)  # a running mean is divided already
        losses = torch.full((di, replicas, ga), float("nan"))
        if collected:
            values = torch.stack(collected)  # 0-dim losses, or each stage replica's GA losses as a vector
            losses[:, local.start : local.stop] = values.float().cpu().view(di, len(local), ga)
        self.last_losses = self.replicas.gather_losses(losses)
        return self.last_losses

    def _update(self, divisor: int) -> None:
        """Reduce, unscale (dividing by `divisor` too: the mean's), check, clip and apply one update; leave
        no gradient behind."""
        pairs = self.gradients.gradients()
        params, grads = (list(t) for t in zip(*pairs)) if pairs else ([], [])
        self.replicas.sum_(grads)
        if not isinstance(self.replicas, LocalReplicas):  # sums from other processes: held as the accumulator
            if self.gradients.running_mean and divisor > 1:
                # A running mean stays a mean over replicas too (PopTorch's Running strategy): the sum of
                # the processes' means is divided before it is held, so it overflows only where a mean does.
                torch._foreach_div_(grads, float(divisor))
                divisor = 1
            self.gradients.hold_(grads)
        clipping = bool(self.max_grad_norm and self.max_grad_norm > 0)
        measured = clipping or self.measure_grad_norm
        norm = self.loss_scaler.unscale_(
            grads, divisor, self.replicas, norm=measured, skip_non_finite=self.skip_non_finite_updates
        )
        self.last_update_applied = norm is not None
        if norm is not None:
            if measured:
                self.last_grad_norm = norm
            if clipping:
                clip_(grads, self.max_grad_norm, torch.tensor(norm))
            fp32_gradients = {p: g for p, g in zip(params, grads) if p.dtype != g.dtype}
            if fp32_gradients and takes_fp32_gradients(self.optimizer):
                self.optimizer.step(gradients=fp32_gradients)
            elif fp32_gradients:  # a torch optimizer: its own step on fp32 copies of the fp16 weights
                with fp32_working_copies(
                    self.optimizer, fp32_gradients, self.stochastic_rounding, self.rounding_generator
                ):
                    self.optimizer.step()
            else:
                self.optimizer.step()
        self.gradients.clear()


class InferenceExecutable:
    """Sharded inference: micro-batches per device iteration and replica, through the stages in turn.

    Args:
        model: the (parallelized) model, in inference mode.
        layout: the call's `CallLayout` (device iterations x replicas; no accumulation); kept as `layout`.
        micro_batch_size: samples per micro-batch (IPUTrainer's `per_device_eval_batch_size`, so a short
            last batch runs short micro-batches); None: each call's batch size over the layout's
            micro-batches (PopTorch's rule, which refuses a batch that does not divide).
        fp16_compute: "emulated" or "native", for an fp16 model.
        cast_inputs: as `TrainingExecutable`'s.
        sets_mode: put the model in eval mode for the call (IPUTrainer); False: as `TrainingExecutable`'s.
        loss_first: a tuple output starts with the loss (transformers' Trainer reads `outputs[0]` as the
            loss of a batch with labels; IPUTrainer sets it then): it is combined as a mapping's `loss` is.
    """

    def __init__(
        self,
        model: nn.Module,
        layout: CallLayout,
        micro_batch_size: int | None = None,
        fp16_compute: str | None = "emulated",
        cast_inputs: bool = True,
        sets_mode: bool = True,
        loss_first: bool = False,
    ):
        if not isinstance(layout, CallLayout):
            raise TypeError(f"InferenceExecutable takes a CallLayout, got {type(layout).__name__}.")
        self.loss_first = loss_first
        self.model = model
        self.layout = layout
        self.micro_batch_size = micro_batch_size
        self.fp16_compute = fp16_compute
        first = next(model.parameters(), None)  # a model with no weights (PopTorch runs those) casts nothing
        self.dtype = first.dtype if first is not None and cast_inputs else None
        self.sets_mode = sets_mode

    @torch.no_grad()
    def __call__(
        self,
        batch: Mapping[str, Any],
        real_samples: int | None = None,
    ):
        """Run `batch` (a whole inference call, possibly padded) and return the model's combined output.

        Args:
            batch: micro-batch x inference replicas x inference device iterations samples (fewer
                for a short last batch that is not padded). A batch with no batched tensor (a forward
                of no arguments) runs each of the call's micro-batches once and returns their outputs.
            real_samples: how many leading samples are real; the rest repeat earlier ones
                (`pad_on_batch_axis`) and are left out of the returned loss.
        """
        if self.sets_mode:
            self.model.eval()
        if not any(isinstance(v, torch.Tensor) and v.dim() > 0 for v in batch.values()):
            return [self.model(**batch) for _ in range(self.layout.micro_batches)]
        if self.dtype is not None:
            batch = cast_floating(batch, self.dtype)
        size = batch_size_of(batch)
        real = size if real_samples is None else real_samples
        micro_batch_size = self.micro_batch_size or self.layout.micro_batch_size(size)
        starts = range(0, size, micro_batch_size)
        split = _split_by_own_sizes(batch, len(starts)) if real_samples is None else None
        outputs, sizes, loss_parts = [], [], []
        with fp16_compute_context(self.fp16_compute, self.model.parameters()):
            for index, start in enumerate(starts):  # [device iteration][replica] order: micro-batches in turn
                stop = min(start + micro_batch_size, size)
                micro = split[index] if split is not None else slice_batch(batch, start, stop)
                out = self.model(**micro)
                outputs.append(out)
                sizes.append(stop - start)
                real_rows = max(0, min(stop, real) - start)
                loss = self._loss_of(out)
                if loss is not None and real_rows:
                    if real_rows < stop - start:  # the IPU ran padding here: its loss comes from real rows only
                        loss = self._loss_of(self.model(**slice_batch(micro, 0, real_rows)))
                    loss_parts.append((loss.detach().float(), real_rows))
        return _combine(outputs, sizes, loss_parts)


    def _loss_of(self, out: Any) -> torch.Tensor | None:
        """The loss in a micro-batch's output: a mapping's `loss`, or a tuple's first item when `loss_first`."""
        if isinstance(out, Mapping):
            return out.get("loss")
        if self.loss_first and isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
            return out[0]
        return None


def _split_by_own_sizes(batch: Mapping[str, Any], parts: int) -> list[dict[str, Any]] | None:
    """`batch` in `parts` micro-batches, each input cut by its own first dimension (PopTorch's rule for
    inputs of different lengths); None when every input has the same length (rows slice alike)."""
    lengths = {v.shape[0] for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0}
    if len(lengths) < 2 or any(n % parts for n in lengths):
        return None
    return split_batch(batch, parts)


def _combine(outputs: list, sizes: list[int], loss_parts: list[tuple[torch.Tensor, int]]):
    """Concatenate micro-batch outputs; the loss is the sample-weighted mean over real samples."""
    first = outputs[0]
    loss = sum(loss * n for loss, n in loss_parts) / sum(n for _, n in loss_parts) if loss_parts else None
    if not isinstance(first, Mapping):
        combined = concatenate(outputs, sizes)
        if loss is not None:  # a tuple whose first item is the loss (`loss_first`)
            combined = type(combined)((loss, *combined[1:]))
        return combined
    combined = {key: concatenate([o[key] for o in outputs], sizes) for key in first if key != "loss"}
    if loss is not None:
        combined["loss"] = loss
    try:
        return type(first)(**combined)  # the model's own ModelOutput class
    except TypeError:
        return combined
