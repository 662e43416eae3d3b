"""`IPUTrainer`: transformers' Trainer running its execution core on the simulated IPU.

The subclass overrides documented hooks only. The Trainer keeps its loop, step counting, LR schedule,
clipping, logging, checkpointing and resuming; below those hooks the IPU semantics take over:

- the data loaders yield combined batches (micro-batch x GA x replicas x device iterations); one
  trainer step is one combined batch, and the Trainer's own gradient accumulation stays 1;
- `training_step` hands the combined batch to a `TrainingExecutable`, which runs every micro-batch
  of every replica with the loss scaled, reduces the gradients in fp32, skips overflows, clips and
  applies the update(s) of the call; the Trainer's own clip and optimizer step that follow find no
  gradient, and its LR schedule advances once per combined batch;
- evaluation runs sharded through an `InferenceExecutable` (per device iteration and replica);
- the model is cast to fp16 unless `--fp32` (its matmuls computed with fp32 partials on a CPU, see
  `runtime.fp16_compute`), laid out on the pipeline's IPUs (`to_pipelined`), and "compiled" before
  training: PopTorch's checks, a per-IPU memory and throughput report;
- the loss scaler and the replicas' random streams ride in the optimizer's state dict (public
  optimizer state-dict hooks), so a checkpoint restores them with the optimizer;
- checkpoints hold plain transformers weights plus the effective `ipu_config.json`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from typing import Any

import torch
from torch import nn
from transformers import Trainer
from transformers.trainer_utils import TrainOutput

from optimum_ipu._once import warn_once
from optimum_ipu.call_layout import CallLayout
from optimum_ipu.checkpoints import AtomicCheckpoints
from optimum_ipu.compiling import compile_inference, compile_training
from optimum_ipu.configuration.schema import FIELD_DEFAULTS
from optimum_ipu.costmodel.workload import StateTypes
from optimum_ipu.overrides import overridden
from optimum_ipu.pipelining import to_pipelined
from optimum_ipu.pipelining.pipeline import untied_output_projection
from optimum_ipu.runtime.batches import batch_size_of, cast_floating, pad_by_repeating
from optimum_ipu.runtime.distributed import hold_process_groups
from optimum_ipu.runtime.executor import InferenceExecutable
from optimum_ipu.runtime.fp16_compute import held_fp32_copies, resolve_fp16_compute
from optimum_ipu.training_args import IPUTrainingArguments, resolve_ipu_config
from optimum_ipu.training_calls import TrainingCalls, ipu_optimizer

logger = logging.getLogger(__name__)


def settings_without_effect(
    ipu_config, args: IPUTrainingArguments, model: nn.Module | None = None
) -> list[str]:
    """Messages for settings the user gave that change nothing on this backend, and why.

    A setting either acts or is named here: a user must never believe a setting acted when it did not.
    `model` (when given) tells whether it has an untied output projection to serialize.
    """
    messages = []
    if args.dataloader_mode != "sync":
        messages.append(
            f"dataloader_mode={args.dataloader_mode!r} has no effect on the simulated IPU: batches come from the "
            "Trainer's DataLoader (use --dataloader_num_workers to load them in the background)."
        )
    for name in ("parallelize_kwargs", "inference_parallelize_kwargs"):
        if vars(ipu_config).get(name):
            messages.append(
                f"{name}={vars(ipu_config)[name]} has no effect: the cut specs here take no parallelize() "
                "arguments (the layout comes from layers_per_ipu and the serialization settings)."
            )
    untied = model is not None and untied_output_projection(model) is not None
    for name in ("projection_serialization_factor", "serialized_projection_splits_per_ipu"):
        default = FIELD_DEFAULTS[name]
        if untied:
            break  # MT5's own LM head: serialized by these settings
        training_value = vars(ipu_config).get(name)
        for key in (name, f"inference_{name}"):
            value = vars(ipu_config).get(key)
            if value in (default, None) or (key != name and value == training_value):
                continue  # an inference value that only inherits the training one is named with it
            messages.append(
                f"{key}={value} has no effect: the model has no output projection of its own to serialize (a "
                "head tied to the word embedding follows embedding_serialization_factor; only an untied one, "
                "as MT5's LM head, follows this)."
            )
    if vars(ipu_config).get("serialized_embedding_splits_per_ipu"):
        messages.append(
            "serialized_embedding_splits_per_ipu: the embedding is split into "
            f"{sum(vars(ipu_config)['serialized_embedding_splits_per_ipu'])} pieces as asked, but at run time "
            "every piece stays on IPU 0's device (the memory model places them per IPU)."
        )
    if not args.fp32 and ipu_config.enable_half_partials:
        messages.append(
            "enable_half_partials=True: matmuls and convolutions accumulate fp32 partial sums on this backend "
            "(at least as accurate as the IPU's fp16 partials; fp16 partial sums are not emulated)."
        )
    if vars(ipu_config).get("output_mode", FIELD_DEFAULTS["output_mode"]) != FIELD_DEFAULTS["output_mode"]:
        messages.append(
            f"output_mode={ipu_config.output_mode!r} has no effect on IPUTrainer: the logged training loss is the "
            "mean over every micro-batch of the combined batch. It sets the output mode of the poptorch.Options "
            "that IPUConfig.to_options() builds."
        )
    if args.fp32 and args.fp16_compute != "auto":
        messages.append(
            f"--fp16_compute {args.fp16_compute} has no effect with --fp32: it picks how fp16 matmuls are computed, "
            "and an fp32 run has none."
        )
    if vars(ipu_config).get("explicit_ir_inference"):
        messages.append(
            "explicit_ir_inference=True has no effect on IPUTrainer: it selects how PopART builds an inference "
            "graph, which computes the same values here. It is set in the poptorch.Options that "
            "IPUConfig.to_options(for_inference=True) builds."
        )
    optim = getattr(args.optim, "value", args.optim)  # the Trainer turns the string into an OptimizerNames
    if not args.fp32 and not args.lamb and optim not in ("adamw_torch", "adamw_torch_fused", "adamw"):
        messages.append(
            f"--optim {optim} has no effect in fp16: fp16 weights are updated by the IPU's AdamW "
            "(fp32 math, stochastic rounding), or LAMB with --lamb. Use --fp32 to train with --optim."
        )
    return messages


def _after(first, function):
    """`function`, calling `first()` before each call (the evaluation's copies let go before its metrics)."""

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        first()
        return function(*args, **kwargs)

    return wrapped


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


def _load_whole_batches(loader) -> None:
    """Every process loads the whole combined batch and runs its replicas' slice of it.

    accelerate shards a training loader's batches over the processes; an IPU run's processes share
    one combined batch instead (its layout decides which replica sees which sample), so the shard is
    made a pass-through, as transformers does for its own rank-aware samplers.
    """
    if isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset):
        raise ValueError(
            "An iterable training data set cannot be shared by the processes of a torchrun launch (each "
            "process must see the whole combined batch): use a map-style data set (with __len__)."
        )
    batch_sampler = getattr(loader, "batch_sampler", None)
    if hasattr(batch_sampler, "num_processes"):  # accelerate's BatchSamplerShard
        batch_sampler.num_processes = 1
        batch_sampler.process_index = 0


def _checked_arguments(model, args, tokenizer, kwargs: dict[str, Any]) -> IPUTrainingArguments:
    """IPUTrainer's arguments, checked: a model (no `model_init`), IPU training arguments (a default set
    when none), and Optimum Graphcore's `tokenizer=` moved to `processing_class` in `kwargs`."""
    if model is None:
        raise ValueError("IPUTrainer needs a model; `model_init` is not supported on the simulated IPU.")
    if kwargs.get("model_init") is not None:
        raise ValueError(
            "IPUTrainer does not support `model_init` (hyper-parameter search); pass `model`."
        )
    if tokenizer is not None:
        if kwargs.get("processing_class") is not None:
            raise ValueError(
                "Pass either `tokenizer=` (the Optimum Graphcore spelling) or `processing_class=`."
            )
        kwargs["processing_class"] = tokenizer
    if args is None:
        args = IPUTrainingArguments(output_dir="tmp_trainer")
    if not isinstance(args, IPUTrainingArguments):
        raise TypeError(
            f"IPUTrainer needs IPUTrainingArguments, got {type(args).__name__}: build "
            "`IPUTrainingArguments(...)` with the same fields (it accepts every TrainingArguments field)."
        )
    return args


class _ShardedModel(nn.Module):
    """What the Trainer's prediction step calls as its model: one inference call on the simulated IPU.

    Each micro-batch's loss is the model's own: its mean over the items it predicts, as Optimum
    Graphcore's inference returned it. transformers' Trainer asks for its own count of the items
    instead (`num_items_in_batch`); that count is dropped here, because it is wrong for a model whose
    loss shifts the labels but whose `loss_type` is None (GPT-2: every label counted, not the shifted
    ones, so 31/32 of the loss on blocks of 32 tokens), and because a count over the whole call would
    shrink the loss by the number of micro-batches per call. The call's loss is the micro-batches'
    sample-weighted mean.

    Args:
        executable: runs the call micro-batch by micro-batch.
        real_samples: leading samples that are real (the rest is `pad_on_batch_axis` padding).
    """

    def __init__(self, executable: InferenceExecutable, real_samples: int):
        super().__init__()
        self.executable = executable
        self.real_samples = real_samples
        self.config = getattr(executable.model, "config", None)

    def forward(self, num_items_in_batch=None, **batch):
        return self.executable(batch, real_samples=self.real_samples)


# AtomicCheckpoints (optimum_ipu/checkpoints/trainer_hooks.py) owns checkpoint saving and resuming: atomic folders,
# the newest complete checkpoint, the setup comparison. It is the only class that overrides private Trainer
# methods (tests/test_trainer.py checks it); this class joins them through its hooks `_gather_process_state`
# and `_model_as_saved`. Keep it first in the bases so its overrides wrap transformers' own. Two private
# attributes are read elsewhere: Seq2SeqTrainer's `_gen_kwargs` (trainer_seq2seq.py, as its `evaluate()` sets
# them) and accelerate's `Accelerator._models` (`release_process_groups`).
class IPUTrainer(AtomicCheckpoints, Trainer):
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
        args = _checked_arguments(model, args, tokenizer, kwargs)
        self.ipu_config = resolve_ipu_config(
            args, model_name_or_path=getattr(model, "name_or_path", None) or None, ipu_config=ipu_config
        ).train()
        self.hardware = hardware
        for message in settings_without_effect(self.ipu_config, args, model):
            warn_once(logger, message)
        self.fp16_compute = None if args.fp32 else resolve_fp16_compute(args.fp16_compute, args.device)
        if not args.fp32:
            model.half()  # IPU training default: fp16 weights and activations
            logger.info("fp16 compute: %s", self.fp16_compute)
        self._pipelined = to_pipelined(model, self.ipu_config, force=force_to_pipelined)
        # One trainer step is one combined batch: `args.train_batch_size` (what the Trainer sizes its loader
        # and step counts from) is micro-batch x GA x replicas x device iterations; evaluation likewise.
        args.set_combined_batch_factors(
            self.ipu_config.batch_size_factor(), self.ipu_config.batch_size_factor(for_inference=True)
        )

        super().__init__(model, args, *positional, **kwargs)
        # Under torchrun each process drives one device (its GPU, or the CPU) for all the IPUs it holds.
        self._ipu_devices = [args.device] * self.ipu_config.ipus_per_replica if args.world_size > 1 else None
        self._pipelined.parallelize(self._ipu_devices)
        self._mode = "training"
        # The host calls of training (`training_calls.py`): the loss scaler, replica streams and processes.
        self._calls = TrainingCalls(self._pipelined, self.ipu_config, args, self.fp16_compute, self.compute_loss)
        self.loss_scaler, self.replica_streams = self._calls.loss_scaler, self._calls.replica_streams
        self.process_replicas = self._calls.process_replicas
        if self.process_replicas is not None:
            hold_process_groups(self)
        self.compile_report = None
        self.compile_seconds: float | None = None
        self.inference_report = None

    def release_process_groups(self) -> None:
        """At exit, drop the DistributedDataParallel wrapper transformers' Trainer made around the model.

        It holds the default process group; `runtime.distributed` releases every holder so gloo's
        threads end before the interpreter's finalization (see `_close_process_group` there).
        """
        self.model_wrapped = self.model
        prepared = getattr(self.accelerator, "_models", None)  # accelerate keeps the models it prepared
        if isinstance(prepared, list):
            prepared[:] = [
                m for m in prepared if not isinstance(m, torch.nn.parallel.DistributedDataParallel)
            ]

    # -- modes -------------------------------------------------------------------------------

    def _use_mode(self, mode: str) -> None:
        """Lay the model out for training or inference (they may place layers differently), and again
        when another pipelined model (an inference pipeline's) laid it out since."""
        if mode == self._mode and self._pipelined.is_parallelized:
            return
        self.ipu_config.train() if mode == "training" else self.ipu_config.eval()
        self._pipelined.parallelize(self._ipu_devices)
        self._mode = mode

    @property
    def _model_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # -- data --------------------------------------------------------------------------------

    def _inference_batch_size(self) -> int:
        return self.args.eval_batch_size

    def get_train_dataloader(self):
        """Combined batches; an incomplete last combined batch is dropped, as on the IPU."""
        combined = self.args.train_batch_size
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
        with overridden(self.args, dataloader_drop_last=True):
            loader = super().get_train_dataloader()
        if self.process_replicas is not None:
            _load_whole_batches(loader)
        return loader

    def get_eval_dataloader(self, eval_dataset=None):
        """Combined inference batches (micro-batch x inference replicas x device iterations); a short last one
        is kept unless `--dataloader_drop_last` (as Optimum Graphcore's evaluation loader), which is then said."""
        return self._said_dropped(super().get_eval_dataloader(eval_dataset))

    def get_test_dataloader(self, test_dataset):
        return self._said_dropped(super().get_test_dataloader(test_dataset))

    def _said_dropped(self, loader):
        """`loader`, after saying once what `--dataloader_drop_last` leaves out of an evaluation."""
        if not self.args.dataloader_drop_last:
            return loader
        try:
            samples = len(loader.dataset)
        except TypeError:  # an iterable dataset: its length is not known
            return loader
        batch = self.args.eval_batch_size
        # What the loader will hand out, over every process (accelerate shares the calls out under torchrun).
        dropped = samples - len(loader) * batch * max(1, self.args.world_size)
        if dropped > 0:
            warn_once(
                logger,
                f"--dataloader_drop_last: evaluation leaves out the last {dropped} of {samples} samples, which do not "
                f"fill a call of {batch} (per_device_eval_batch_size x inference replicas x inference device "
                f"iterations) in each of {max(1, self.args.world_size)} process(es), as Optimum Graphcore does. Leave "
                "--dataloader_drop_last out to evaluate them.",
                key=("eval drop_last", samples, batch),
            )
        return loader

    def get_total_train_batch_size(self, args) -> int:
        """One combined batch per step, however many processes share its replicas."""
        return self._train_batch_size * args.gradient_accumulation_steps

    # -- optimizer ---------------------------------------------------------------------------

    def create_optimizer(self, model=None):
        """AdamW (fp32 math on fp16 weights, stochastic rounding) or LAMB with `--lamb`.

        fp16 training keeps Optimum Graphcore's state types: the gradient accumulator and the first
        moment in fp16, the second moment in fp32 (its `create_optimizer` in 0.7). With `--fp32` every
        state is fp32, and without `--lamb` the optimizer transformers would pick (`--optim`) is used,
        so an fp32 run matches plain transformers. Either way the optimizer's state dict also carries
        the loss scaler and the replicas' random streams (`TrainingCalls.carry_in`).
        """
        if self.optimizer is not None:
            return self.optimizer
        args = self.args
        if args.fp32 and not args.lamb:
            self._calls.carry_in(super().create_optimizer(model))
            return self.optimizer
        model = model if model is not None else self.model
        self.optimizer = ipu_optimizer(model, set(self.get_decay_parameter_names(model)), args)
        self._calls.carry_in(self.optimizer)
        return self.optimizer

    # -- training ----------------------------------------------------------------------------

    def _compile_for_training(self) -> None:
        # Compiling draws a sample batch through the data collator (and may run the model): random
        # state is put back afterwards, so that a seeded run (e.g. a masked-LM collator's masks) is
        # the same as with transformers' Trainer, which compiles nothing. The sample is the first
        # micro-batch of the first combined batch, loaded alone: a combined batch of real inputs can
        # be gigabytes (ViT at micro-batch 17 x GA 128: 2,176 images), and compiling needs one micro-batch.
        with _random_state_kept(self.data_collator):
            with overridden(self, _train_batch_size=self.args.per_device_train_batch_size):
                loader = self.get_train_dataloader()
            sample = next(iter(loader))
            compiled = compile_training(
                self._pipelined, self.ipu_config, sample_batch=cast_floating(sample, self._model_dtype),
                micro_batch_size=self.args.per_device_train_batch_size, hardware=self.hardware,
                optimizer_name="lamb" if self.args.lamb else "adamw", fp32=self.args.fp32,
                fp16_compute=self.fp16_compute, memory_check=self.args.ipu_memory_check,
                # the state types of an optimizer given to the trainer, else Optimum Graphcore's for the precision
                state_types=None if self.optimizer is None else StateTypes.of_optimizer(self.optimizer),
                processes=1 if self.process_replicas is None else self.process_replicas.layout.world_size,
            )  # fmt: skip
        self.compile_report = compiled.report
        self.compile_seconds = compiled.seconds  # the log's "Compiled model in N secs"

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """Compile (checks and hardware report, excluded from speed metrics), then train as transformers does."""
        self._use_mode("training")
        logger.info("Combined batch: %s", self.ipu_config.describe_combined_batch(self.args.per_device_train_batch_size))
        self._compile_for_training()
        if self.args.compile_only:
            if self.compile_report is not None and self.args.should_save:
                self.compile_report.save(self.args.output_dir)
            logger.info(
                "compile_only: compilation done, report written to %s; no training.", self.args.output_dir
            )
            return TrainOutput(global_step=0, training_loss=0.0, metrics={"compile_only": True})
        output = super().train(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)
        self._gather_process_state()  # every process leaves training with the whole, current state
        return output

    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch=None
    ) -> torch.Tensor:
        """One host call on the combined batch; returns the mean micro-batch loss for logging."""
        self._use_mode("training")
        # Gradients are reduced by the executable, not DDP: it runs the unwrapped model.
        return self._calls.step(self.accelerator.unwrap_model(model), self.optimizer, inputs)

    # -- processes -----------------------------------------------------------------------------

    def _gather_process_state(self) -> None:
        """Give every process what rank 0 saves and what evaluation reads (`TrainingCalls.gather_process_state`)."""
        self._calls.gather_process_state(self.optimizer)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        self._gather_process_state()
        super().save_model(output_dir, _internal_call)

    def evaluate(self, *args, **kwargs):
        self._gather_process_state()
        return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        self._gather_process_state()
        return super().predict(*args, **kwargs)

    # -- evaluation ----------------------------------------------------------------------------

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Sharded inference on a combined batch; a short last batch is padded when `pad_on_batch_axis`.

        The Trainer's own prediction step does the bookkeeping (labels, ignore_keys, the loss); the
        model it calls is the `InferenceExecutable`, which runs the batch micro-batch by micro-batch
        and leaves padded samples out of the loss. Each micro-batch's loss is the model's own mean over
        its items and the call's loss is their sample-weighted mean, so `eval_loss` is the model's loss
        as a plain loop over micro-batches of `per_device_eval_batch_size` gives it, whatever the device
        iterations and replicas (see `_ShardedModel` for where transformers' Trainer differs).
        """
        self._use_mode("inference")
        size = batch_size_of(inputs)
        if self.args.pad_on_batch_axis and size < self._inference_batch_size():
            inputs = pad_by_repeating(inputs, self._inference_batch_size())
        inputs = cast_floating(inputs, self._model_dtype)
        if self.inference_report is None:
            compiled = compile_inference(
                self._pipelined, self.ipu_config, sample_batch=inputs,
                micro_batch_size=self.args.per_device_eval_batch_size, hardware=self.hardware, fp32=self.args.fp32,
                fp16_compute=self.fp16_compute, memory_check=self.args.ipu_memory_check,
            )  # fmt: skip
            self.inference_report = compiled.report
        # transformers' prediction step reads a tuple output's first item as the loss of a batch with labels.
        has_labels = bool(self.label_names) and all(inputs.get(k) is not None for k in self.label_names)
        executable = _ShardedModel(
            InferenceExecutable(model, CallLayout.from_ipu_config(self.ipu_config, for_inference=True),
                                self.args.per_device_eval_batch_size, self.fp16_compute, loss_first=has_labels),
            real_samples=size,
        )  # fmt: skip
        # Each process's call is its own: no count of loss items gathered over the processes, and no
        # rescaling of the call's loss for them (the evaluation loop averages the calls).
        with overridden(self.args, average_tokens_across_devices=False):
            loss, logits, labels = super().prediction_step(
                executable, inputs, prediction_loss_only, ignore_keys
            )
        return _to_float32(loss), _trim(_to_float32(logits), size), _trim(_to_float32(labels), size)

    def evaluation_loop(self, *args, **kwargs):
        """transformers' loop on the inference layout; the weights stay the same from one call to the next,
        so with emulated fp16 each call reads fp32 copies of them made once for the loop, let go before
        the metrics are computed."""
        try:
            self._use_mode("inference")
            with held_fp32_copies(self.fp16_compute, self.model.parameters()) as release:
                metrics = self.compute_metrics
                with overridden(self, compute_metrics=metrics and _after(release, metrics)):
                    return super().evaluation_loop(*args, **kwargs)
        finally:
            self._use_mode("training")

    # -- saving and logging ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _model_as_saved(self, output_dir: str):
        """Save plain transformers modules (serialization undone), then the effective `ipu_config.json`
        (AtomicCheckpoints' `_save` runs transformers' inside this)."""
        was_parallelized = self._pipelined.is_parallelized
        self._pipelined.deparallelize()
        try:
            yield
        finally:
            if was_parallelized:
                self._pipelined.parallelize(self._ipu_devices)
        if self.args.should_save:
            self.ipu_config.save_pretrained(output_dir)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add the loss scale, skipped updates and the estimated throughput of the real system.

        The Trainer's `grad_norm` is replaced by the executable's: the Trainer measures gradients
        after the executable has applied and released them.
        """
        own = self._calls.log_entries(logs)
        report = self.compile_report if "train_samples_per_second" in logs else None
        if any(k.endswith("_samples_per_second") and not k.startswith("train") for k in logs):
            report = self.inference_report or report
        estimate = getattr(report, "estimated_samples_per_second", None)
        if estimate is not None and math.isfinite(estimate):
            own["ipu_estimated_samples_per_second"] = round(float(estimate), 2)
        logged = {**logs, **own}
        super().log(logged, start_time)
        # transformers' log() adds `epoch` (and token counts) to the caller's dict, and evaluate() returns that
        # dict: hand those back too, so evaluate() returns what transformers' does (our own keys stay in the log).
        logs.update({key: value for key, value in logged.items() if key not in own and key not in logs})


@contextlib.contextmanager
def _random_state_kept(collator: Any):
    """Restore torch's, numpy's and Python's global random state, and `collator.generator`, on exit."""
    import random

    import numpy as np

    while hasattr(collator, "__wrapped__") and not hasattr(collator, "generator"):  # pad_on_batch_axis(...)
        collator = collator.__wrapped__
    generator = getattr(collator, "generator", None)  # transformers' collators make it on first use
    saved_generator = (
        generator.get_state()
        if isinstance(generator, torch.Generator)
        else generator.bit_generator.state
        if isinstance(generator, np.random.Generator)
        else None
    )
    cuda = (
        torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    )
    saved = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if generator is None and getattr(collator, "generator", None) is not None:
            collator.generator = None  # made while compiling: made again, from its seed, by the first batch
        elif isinstance(generator, torch.Generator):
            generator.set_state(saved_generator)
        elif isinstance(generator, np.random.Generator):
            generator.bit_generator.state = saved_generator
