"""`IPUTrainer`: transformers' Trainer running its execution core on the simulated IPU.

The subclass overrides documented hooks only. The Trainer keeps its loop, step counting, LR schedule,
clipping, logging, checkpointing and resuming; below those hooks the IPU semantics take over:

- the data loaders yield combined batches (micro-batch x GA x replicas x device iterations); one
  trainer step is one combined batch, and the Trainer's own gradient accumulation stays 1;
- `training_step` hands the combined batch to a `TrainingExecutable` that splits it into
  micro-batches, accumulates and reduces gradients, applies loss scaling and leaves the unscaled
  gradients (None after an overflow, so the update is skipped) for the Trainer's clip and step;
- the model is cast to fp16 unless `--fp32`, laid out on the pipeline's IPUs (`to_pipelined`), and
  "compiled" before training: PopTorch's checks, a per-IPU memory and throughput report;
- checkpoints hold plain transformers weights plus the effective `ipu_config.json`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from typing import Any

import torch
from torch import nn
from transformers import Trainer

from optimum_ipu.pipelining import to_pipelined
from optimum_ipu.pipelining.pipeline import _move_to
from optimum_ipu.runtime.compile_report import compile_inference, compile_training
from optimum_ipu.runtime.executor import TrainingExecutable, batch_size_of, cast_floating
from optimum_ipu.runtime.kernels import use_fp32_partials_in_convolutions
from optimum_ipu.runtime.optimizers import LAMB, AdamW
from optimum_ipu.runtime.precision import LossScaler
from optimum_ipu.training_args import IPUTrainingArguments, resolve_ipu_config

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _overridden(obj, **values):
    """Temporarily set attributes (the Trainer reads batch size and drop_last from its args)."""
    saved = {k: getattr(obj, k) for k in values}
    try:
        for k, v in values.items():
            setattr(obj, k, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(obj, k, v)


def _pad_by_repeating(batch: dict[str, Any], size: int) -> dict[str, Any]:
    """Pad every batched tensor to `size` rows by repeating samples (`pad_on_batch_axis`)."""
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] < size:
            index = torch.arange(size, device=value.device) % value.shape[0]
            value = value.index_select(0, index)
        out[key] = value
    return out


def _to_float32(value):
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_to_float32(v) for v in value)
    return value


def _trim(value, size: int):
    if isinstance(value, torch.Tensor):
        return value[:size] if value.dim() > 0 else value
    if isinstance(value, (tuple, list)):
        return type(value)(_trim(v, size) for v in value)
    return value


class IPUTrainer(Trainer):
    """A transformers `Trainer` whose training and evaluation run on a simulated IPU system.

    Args:
        model: the transformers model to train (a supported architecture, or any model with an
            `nn.ModuleList` of layers when `force_to_pipelined=True`).
        ipu_config: the `IPUConfig`; when None it is loaded from `args.ipu_config_name` or the
            model's name. Training arguments are applied on top (pod type, GA, overrides).
        args: `IPUTrainingArguments`.
        tokenizer: the original Optimum Graphcore keyword, accepted as `processing_class`.
        force_to_pipelined: place an unregistered architecture with the generic cut.
        hardware: the simulated chip, "mk2" (default) or "bow".
        **kwargs: every other `transformers.Trainer` argument (data_collator, train_dataset,
            eval_dataset, processing_class, compute_metrics, callbacks, optimizers, ...).
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        ipu_config=None,
        args: IPUTrainingArguments | None = None,
        *positional,
        tokenizer=None,
        force_to_pipelined: bool = False,
        hardware: str = "mk2",
        **kwargs,
    ):
        if model is None:
            raise ValueError("IPUTrainer needs a model; `model_init` is not supported on the simulated IPU.")
        if kwargs.get("model_init") is not None:
            raise ValueError("IPUTrainer does not support `model_init` (hyper-parameter search); pass `model`.")
        if tokenizer is not None:
            if kwargs.get("processing_class") is not None:
                raise ValueError("Pass either `tokenizer=` (the Optimum Graphcore spelling) or `processing_class=`.")
            kwargs["processing_class"] = tokenizer
        if args is None:
            args = IPUTrainingArguments(output_dir="tmp_trainer")
        if not isinstance(args, IPUTrainingArguments):
            raise TypeError(
                f"IPUTrainer needs IPUTrainingArguments, got {type(args).__name__}: build "
                "`IPUTrainingArguments(...)` with the same fields (it accepts every TrainingArguments field)."
            )

        self.ipu_config = resolve_ipu_config(
            args, model_name_or_path=getattr(model, "name_or_path", None) or None, ipu_config=ipu_config
        ).train()
        self.hardware = hardware
        if not args.fp32:
            model.half()  # IPU training default: fp16 weights and activations
            use_fp32_partials_in_convolutions(model)  # torch's CPU fp16 conv backward is ~50x slow
        self._pipelined = to_pipelined(model, self.ipu_config, force_to_pipelined=force_to_pipelined)

        super().__init__(model, args, *positional, **kwargs)
        # One trainer step is one combined batch: the Trainer sizes its loader and its step counts from this.
        self._train_batch_size = args.per_device_train_batch_size * self.ipu_config.batch_size_factor()
        self._pipelined.parallelize()
        self._mode = "training"
        self._executable: TrainingExecutable | None = None
        self.compile_report = None
        self.inference_report = None

    # -- modes -------------------------------------------------------------------------------

    def _use_mode(self, mode: str) -> None:
        """Lay the model out for training or inference (they may place layers differently)."""
        if mode == self._mode:
            return
        self.ipu_config.train() if mode == "training" else self.ipu_config.eval()
        self._pipelined.parallelize()
        self._mode = mode

    @property
    def _model_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # -- data --------------------------------------------------------------------------------

    def _inference_batch_size(self) -> int:
        return self.args.per_device_eval_batch_size * self.ipu_config.batch_size_factor(for_inference=True)

    def get_train_dataloader(self):
        """Combined batches; an incomplete last combined batch is dropped, as on the IPU."""
        combined = self._train_batch_size
        dataset = self.train_dataset
        if dataset is not None and hasattr(dataset, "__len__") and len(dataset) < combined:
            cfg = self.ipu_config
            raise ValueError(
                f"The training set has {len(dataset)} samples, fewer than one combined batch of {combined} "
                f"(micro-batch {self.args.per_device_train_batch_size} x gradient accumulation "
                f"{cfg.gradient_accumulation_steps} x replicas {cfg.replication_factor} x device iterations "
                f"{cfg.device_iterations}), so no training step could run. Use more data, or lower "
                "--per_device_train_batch_size / --gradient_accumulation_steps / the replication "
                "(--pod_type, --n_ipu) / device_iterations."
            )
        with _overridden(self.args, dataloader_drop_last=True):
            return super().get_train_dataloader()

    def get_eval_dataloader(self, eval_dataset=None):
        """Combined inference batches (micro-batch x inference replicas x device iterations); the last is kept."""
        with _overridden(
            self.args, per_device_eval_batch_size=self._inference_batch_size(), dataloader_drop_last=False
        ):
            return super().get_eval_dataloader(eval_dataset)

    def get_test_dataloader(self, test_dataset):
        with _overridden(
            self.args, per_device_eval_batch_size=self._inference_batch_size(), dataloader_drop_last=False
        ):
            return super().get_test_dataloader(test_dataset)

    # -- optimizer ---------------------------------------------------------------------------

    def create_optimizer(self, model=None):
        """AdamW (fp32 math on fp16 weights, stochastic rounding) or LAMB with `--lamb`.

        With `--fp32` and no `--lamb`, the optimizer transformers would pick (`--optim`) is used, so an
        fp32 run matches plain transformers.
        """
        if self.optimizer is not None:
            return self.optimizer
        args = self.args
        if args.fp32 and not args.lamb:
            return super().create_optimizer(model)
        model = model if model is not None else self.model
        decay = set(self.get_decay_parameter_names(model))
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [
            {"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
        ]
        common = dict(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), stochastic_rounding=not args.fp32)
        if args.lamb:
            self.optimizer = LAMB(groups, eps=args.adam_epsilon, bias_correction=not args.lamb_no_bias_correction, **common)
        else:
            self.optimizer = AdamW(groups, eps=args.adam_epsilon, **common)
        return self.optimizer

    # -- training ----------------------------------------------------------------------------

    def _compile_for_training(self) -> None:
        loader = self.get_train_dataloader()
        sample = next(iter(loader))
        compiled = compile_training(
            self._pipelined, self.ipu_config, sample_batch=cast_floating(sample, self._model_dtype),
            micro_batch_size=self.args.per_device_train_batch_size, hardware=self.hardware,
            optimizer_name="lamb" if self.args.lamb else "adamw", fp32=self.args.fp32,
        )  # fmt: skip
        self.compile_report = compiled.report

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """Compile (checks and hardware report, excluded from speed metrics), then train as transformers does."""
        self._use_mode("training")
        cfg = self.ipu_config
        logger.info(
            "Combined batch: micro-batch %d x gradient accumulation %d x replicas %d x device iterations %d = %d",
            self.args.per_device_train_batch_size, cfg.gradient_accumulation_steps, cfg.replication_factor,
            cfg.device_iterations, self._train_batch_size,
        )  # fmt: skip
        self._compile_for_training()
        if self.args.compile_only:
            if self.compile_report is not None and self.args.should_save:
                self.compile_report.save(self.args.output_dir)
            logger.info("compile_only: compilation done, report written to %s; exiting.", self.args.output_dir)
            sys.exit(0)
        return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)

    def _build_executable(self, model: nn.Module) -> TrainingExecutable:
        scaler = LossScaler(
            self.optimizer, initial_scale=self.args.loss_scaling or 1.0, auto=bool(self.args.auto_loss_scaling)
        )
        return TrainingExecutable(
            model,
            self.ipu_config,
            loss_fn=lambda micro_batch: self.compute_loss(model, micro_batch),
            optimizer=self.optimizer,
            loss_scaler=scaler,
            max_grad_norm=self.args.max_grad_norm,
        )

    def training_step(self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch=None) -> torch.Tensor:
        """One host call on the combined batch; returns the mean micro-batch loss for logging."""
        self._use_mode("training")
        if self._executable is None or self._executable.optimizer is not self.optimizer:
            self._executable = self._build_executable(model)
        self._executable(_move_to(inputs, self.args.device))
        return self._executable.last_losses.mean().to(self.args.device)

    # -- evaluation ----------------------------------------------------------------------------

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Sharded inference on a combined batch; a short last batch is padded when `pad_on_batch_axis`."""
        self._use_mode("inference")
        size = batch_size_of(inputs)
        if self.args.pad_on_batch_axis and size < self._inference_batch_size():
            inputs = _pad_by_repeating(inputs, self._inference_batch_size())
        inputs = cast_floating(inputs, self._model_dtype)
        if self.inference_report is None:
            compiled = compile_inference(
                self._pipelined, self.ipu_config, sample_batch=inputs, hardware=self.hardware, fp32=self.args.fp32
            )
            self.inference_report = compiled.report
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        return _to_float32(loss), _trim(_to_float32(logits), size), _trim(_to_float32(labels), size)

    def evaluation_loop(self, *args, **kwargs):
        try:
            return super().evaluation_loop(*args, **kwargs)
        finally:
            self._use_mode("training")

    # -- saving and logging ----------------------------------------------------------------------

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """Save plain transformers modules (serialization undone) and the effective `ipu_config.json`."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        was_parallelized = self._pipelined.is_parallelized
        self._pipelined.deparallelize()
        try:
            super()._save(output_dir, state_dict)
        finally:
            if was_parallelized:
                self._pipelined.parallelize()
        if self.args.should_save:
            self.ipu_config.save_pretrained(output_dir)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add the simulator's estimate of the real system's throughput beside the measured one."""
        report = self.compile_report if "train_samples_per_second" in logs else None
        if any(k.endswith("_samples_per_second") and not k.startswith("train") for k in logs):
            report = self.inference_report or report
        estimate = getattr(report, "estimated_samples_per_second", None)
        if estimate is not None and math.isfinite(estimate):
            logs = {**logs, "ipu_estimated_samples_per_second": round(float(estimate), 2)}
        super().log(logs, start_time)
