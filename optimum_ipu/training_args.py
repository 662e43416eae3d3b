"""`IPUTrainingArguments`: transformers' training arguments plus the IPU ones Optimum Graphcore users pass.

Two rules keep the Trainer's own bookkeeping right. One trainer step is one combined batch, so the
Trainer's gradient accumulation stays 1: `--gradient_accumulation_steps` is kept aside in
`ipu_gradient_accumulation_steps` and overrides the IPU config's value. And the IPU trains in fp16 on
its own terms, so `--fp16` never turns on torch autocast. Old command lines keep working: the
arguments transformers v5 removed (`--warmup_ratio`, `--overwrite_output_dir`, `--evaluation_strategy`,
`--logging_dir`) are accepted and mapped.

`resolve_ipu_config(args, model_name_or_path)` turns the arguments and a config name into the
effective `IPUConfig` of a run.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import TrainingArguments

from optimum_ipu._once import warn_once
from optimum_ipu.configuration import IPUConfig, load_ipu_config, total_ipus

__all__ = ["IPUTrainingArguments", "resolve_ipu_config"]

logger = logging.getLogger(__name__)


@dataclass
class IPUTrainingArguments(TrainingArguments):
    """Training arguments for a run on (simulated) IPUs; every field doubles as a `--flag`.

    After `__post_init__`: `gradient_accumulation_steps` is 1 and the value given on the command line
    (or None) is in `ipu_gradient_accumulation_steps`; `fp16`/`bf16` are False; `n_ipu` is filled from
    `pod_type`; `warmup_ratio` has been copied to `warmup_steps` and `evaluation_strategy` to
    `eval_strategy`. A copy made with `dataclasses.replace` keeps an explicit accumulation value; a
    copy of arguments that gave none reads as 1 unless `gradient_accumulation_steps=None` is passed.
    """

    ipu_config_name: str | None = field(
        default=None,
        metadata={"help": "IPU config name or path (ipu_config.json) if not the same as the model's."},
    )
    n_ipu: int | None = field(
        default=None,
        metadata={"help": "Total number of IPUs; replication_factor = n_ipu // ipus_per_replica."},
    )
    pod_type: str | None = field(
        default=None,
        metadata={
            "help": "Older spelling of n_ipu: podN (N a power of two, e.g. pod16). Also picks the "
            "entry of pod-keyed values in old IPU configs."
        },
    )
    fp32: bool = field(default=False, metadata={"help": "Train in fp32 instead of the IPU's default fp16."})
    lamb: bool = field(default=False, metadata={"help": "Use the LAMB optimizer instead of AdamW."})
    lamb_no_bias_correction: bool = field(
        default=False, metadata={"help": "Use LAMB without bias correction."}
    )
    loss_scaling: float | None = field(
        default=None,
        metadata={
            "help": "Static loss scaling factor (e.g. 64 to 32768): the loss is multiplied before "
            "backward and the gradients divided back before the update."
        },
    )
    auto_loss_scaling: bool = field(
        default=False,
        metadata={
            "help": "Adapt the loss scale automatically (training only). `auto_loss_scaling: true` in the "
            "IPU config turns it on as well; either source is enough."
        },
    )
    fp16_compute: Literal["auto", "emulated", "native"] = field(
        default="auto",
        metadata={
            "help": "How fp16 matmuls, convolutions and attention are computed: emulated (fp16 values, fp32 "
            "partials, fp16 results: fp32 speed on any CPU), native (torch's fp16 kernels, fast on CUDA), "
            "auto (emulated on CPUs, native on CUDA). The environment variable OPTIMUM_IPU_FP16_COMPUTE "
            "sets it when this is auto."
        },
    )
    dataloader_mode: Literal["sync", "async", "async_rebatched"] = field(
        default="sync",
        metadata={"help": "How the data loader feeds the IPUs: sync, async or async_rebatched."},
    )
    compile_only: bool = field(
        default=False, metadata={"help": "Compile the model, report the layout and exit without training."}
    )
    ipu_memory_check: Literal["auto", "margin", "strict", "off"] = field(
        default="auto",
        metadata={
            "help": "When compiling refuses a layout the memory model calls out of memory: margin (over the "
            "limit by more than the model's measured error; a layout within it runs with one warning), strict "
            "(any estimate over the limit, as Poplar refuses an actual overflow), off (never; report only). "
            "auto: the environment variable OPTIMUM_IPU_MEMORY_CHECK, else margin."
        },
    )
    ipu_config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "Override IPU config attributes, e.g. "
            '"embedding_serialization_factor=2,matmul_proportion=[0.1 0.2 0.3 0.3]".'
        },
    )
    allow_batch_change_on_resume: bool = field(
        default=False,
        metadata={
            "help": "Resume from a checkpoint written with another micro-batch, gradient accumulation, "
            "replication or device iterations: training continues from the same number of samples "
            "(without it, such a resume is an error naming the changed fields)."
        },
    )
    pad_on_batch_axis: bool = field(
        default=False,
        metadata={"help": "Pad short batches by repeating samples (predictions are trimmed back)."},
    )
    gradient_accumulation_steps: int | None = field(
        default=None,
        metadata={
            "help": "Micro-batches accumulated per weight update on the IPU; overrides the IPU config "
            "when given. The Trainer itself never accumulates: one step is one combined batch."
        },
    )
    ipu_gradient_accumulation_steps: int | None = field(
        default=None,
        metadata={"help": "Set from --gradient_accumulation_steps (None: the IPU config decides)."},
    )
    # Set by IPUTrainer from the IPU config: samples per micro-batch sample in a training / inference call.
    train_batch_factor: int = field(default=1, init=False, repr=False)
    eval_batch_factor: int = field(default=1, init=False, repr=False)
    # Removed by transformers v5; accepted so Optimum Graphcore command lines run unchanged.
    warmup_ratio: float | None = field(
        default=None,
        metadata={
            "help": "Removed in transformers v5: the share of steps used for warmup; copied to "
            "--warmup_steps, which takes a float < 1 as a ratio."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Removed in transformers v5; accepted and ignored by the Trainer (example scripts "
            "read it to decide whether to resume from the last checkpoint in output_dir)."
        },
    )
    evaluation_strategy: str | None = field(
        default=None, metadata={"help": "Removed in transformers v5: the old name of --eval_strategy."}
    )
    logging_dir: str | None = field(
        default=None,
        metadata={
            "help": "Removed in transformers v5: TensorBoard log folder. Sets TENSORBOARD_LOGGING_DIR "
            "(where v5 looks) unless it is set already; used with --report_to tensorboard."
        },
    )

    def __post_init__(self) -> None:
        self._check_pods()
        self._check_numbers()
        self._take_gradient_accumulation()
        self._take_precision()
        self._take_optimizer_flags()
        self._turn_off_torch_compile()
        self._map_removed_arguments()
        self._processes_on_cpu()
        super().__post_init__()

    @property
    def device(self) -> torch.device:
        """transformers' device, with a CPU always `cpu` (accelerate names it `cpu:<rank>` under torchrun,
        which torch.load cannot map a checkpoint to on transformers < 5.10)."""
        device = super().device
        return torch.device("cpu") if device.type == "cpu" else device

    @property
    def train_batch_size(self) -> int:
        """Samples per trainer step: the combined batch, micro-batch x GA x replicas x device iterations."""
        return self.per_device_train_batch_size * self.train_batch_factor

    @property
    def eval_batch_size(self) -> int:
        """Samples per inference call: micro-batch x inference replicas x inference device iterations."""
        return self.per_device_eval_batch_size * self.eval_batch_factor

    def set_combined_batch_factors(self, training: int, inference: int) -> None:
        """Record the IPU config's batch size factors (IPUTrainer does this when it resolves the config)."""
        self.train_batch_factor, self.eval_batch_factor = int(training), int(inference)

    def _processes_on_cpu(self) -> None:
        """Under torchrun on a host without CUDA, the processes run on the CPU and talk over gloo.

        transformers only treats a CPU launch as distributed with `use_cpu`; without it every process
        would believe it is alone and train the whole system by itself.
        """
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
            self.use_cpu = True

    def _check_pods(self) -> None:
        self.n_ipu = total_ipus(self.pod_type, self.n_ipu)

    def _check_numbers(self) -> None:
        """Reject values that would only fail at the first step (or never, training on nonsense)."""
        scale = self.loss_scaling
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                  or not math.isfinite(scale) or scale <= 0):  # fmt: skip
            raise ValueError(
                f"--loss_scaling must be a finite number > 0 (e.g. 64 to 32768), got {scale!r}; leave it out "
                "for no loss scaling, or use --auto_loss_scaling."
            )
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"--{name} is the micro-batch size and must be an integer >= 1, got {value!r}."
                )

    def _take_gradient_accumulation(self) -> None:
        if self.gradient_accumulation_steps is not None and self.ipu_gradient_accumulation_steps is None:
            self.ipu_gradient_accumulation_steps = self.gradient_accumulation_steps
        steps = self.ipu_gradient_accumulation_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"--gradient_accumulation_steps must be an integer >= 1, got {steps!r}.")
        self.gradient_accumulation_steps = 1

    def _take_precision(self) -> None:
        for flag in ("bf16", "bf16_full_eval"):
            if getattr(self, flag):
                raise ValueError(
                    f"--{flag} is not supported: IPUs train and evaluate in fp16 by default (with loss scaling), "
                    f"or in fp32 with --fp32. Drop --{flag}."
                )
        if self.fp16_full_eval:
            # transformers' evaluation loop would cast the model to fp16 in place, training on in fp16 after
            # an evaluate() under --fp32; Optimum Graphcore never read the flag.
            warn_once(
                logger,
                "--fp16_full_eval has no effect on the simulated IPU: evaluation runs in the model's precision "
                "(fp16, or fp32 with --fp32), as in Optimum Graphcore. It is turned off.",
                key="fp16_full_eval",
            )
            self.fp16_full_eval = False
        if self.fp16:
            if self.fp32:
                raise ValueError("--fp16 and --fp32 contradict each other: give one of them.")
            logger.info("--fp16 is the IPU default (half precision); it does not turn on torch autocast.")
            self.fp16 = False

    def _take_optimizer_flags(self) -> None:
        if self.lamb_no_bias_correction:
            self.lamb = True  # Optimum Graphcore: either flag replaces AdamW with LAMB

    def _turn_off_torch_compile(self) -> None:
        # transformers turns torch_compile on when a backend or mode is given, and then has accelerate compile
        # the model: all three are cleared before it looks.
        given = [f"--{name}" for name in ("torch_compile", "torch_compile_backend", "torch_compile_mode")
                 if getattr(self, name)]  # fmt: skip
        if given:
            warn_once(
                logger,
                f"{', '.join(given)}: no effect on the simulated IPU: the model runs as its IPU config lays it out, "
                "with the IPU's fp16 arithmetic, which torch.compile would replace (Optimum Graphcore never read "
                "them: PopTorch compiles the model). torch.compile is turned off.",
                key=("torch_compile", *given),
            )
        self.torch_compile, self.torch_compile_backend, self.torch_compile_mode = False, None, None

    def _map_removed_arguments(self) -> None:
        if self.warmup_ratio is not None:
            ratio = self.warmup_ratio
            if not 0 <= ratio < 1:
                raise ValueError(f"--warmup_ratio must be in [0, 1), got {ratio}.")
            if self.warmup_steps not in (0, ratio):
                raise ValueError(
                    f"--warmup_ratio {ratio} and --warmup_steps {self.warmup_steps} both set the warmup: "
                    "give one of them."
                )
            self.warmup_steps = ratio
        if self.evaluation_strategy is not None:
            if self.eval_strategy not in ("no", self.evaluation_strategy):
                raise ValueError(
                    f"--evaluation_strategy {self.evaluation_strategy} and --eval_strategy {self.eval_strategy} "
                    "disagree: give --eval_strategy only."
                )
            self.eval_strategy = self.evaluation_strategy
        if self.overwrite_output_dir:
            logger.info(
                "--overwrite_output_dir was removed in transformers v5; it is accepted and changes nothing in "
                "the Trainer (which writes into output_dir either way)."
            )
        if self.logging_dir is not None:
            os.environ.setdefault("TENSORBOARD_LOGGING_DIR", os.path.expanduser(self.logging_dir))


def resolve_ipu_config(
    args: IPUTrainingArguments,
    model_name_or_path: str | os.PathLike | None = None,
    ipu_config: IPUConfig | None = None,
) -> IPUConfig:
    """The effective IPU config of a run, in training mode.

    Order: a copy of `ipu_config` if given, else `IPUConfig.from_pretrained(args.ipu_config_name or
    model_name_or_path)` (pod-keyed values picked by `pod_type` / `n_ipu`); then the command line:
    `--gradient_accumulation_steps`, `--gradient_checkpointing` (`recompute_checkpoint_every_layer`),
    `--auto_loss_scaling`; then `--ipu_config_overrides`, which win; last, `n_ipu` sets the replication
    factors from the final `ipus_per_replica` (unless an override set them). The config's `seed` is the
    run's `--seed`, as Optimum Graphcore's trainer sets it (nothing reads the config's own), said once
    when the config or an override gave another.

    Raises:
        IPUConfigError: for an invalid override, or an `n_ipu` that is not a multiple of
            `ipus_per_replica`.
        FileNotFoundError: when no config can be found under that name.
    """
    name = ipu_config if ipu_config is not None else (args.ipu_config_name or model_name_or_path)
    if name is None:
        raise ValueError("No IPU config: pass --ipu_config_name (a Hub id or a path) or a model name.")
    changes: dict = {}
    if args.ipu_gradient_accumulation_steps is not None:
        changes["gradient_accumulation_steps"] = args.ipu_gradient_accumulation_steps
    if getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None):
        changes["recompute_checkpoint_every_layer"] = True
    if args.auto_loss_scaling:
        changes["auto_loss_scaling"] = True
    config = load_ipu_config(
        name,
        n_ipu=args.n_ipu,
        pod_type=args.pod_type,
        changes=changes,
        overrides=args.ipu_config_overrides,
        mode="training",
    )
    if config.seed is not None and config.seed != args.seed:
        warn_once(
            logger,
            f"The IPU config's seed={config.seed} is replaced by the run's --seed {args.seed}, as in Optimum "
            f"Graphcore: pass --seed {config.seed} to train with it.",
            key=("ipu config seed", config.seed, args.seed),
        )
    config.seed = args.seed

    if config.replicated_tensor_sharding and config.replication_factor == 1:
        logger.warning("replicated_tensor_sharding has no effect with replication_factor=1 (one replica).")
    logger.info(
        "IPU config: %d IPUs (%d replicas × %d IPUs per replica); combined batch per training step: %s",
        config.num_ipus(),
        config.replication_factor,
        config.ipus_per_replica,
        config.describe_combined_batch(args.per_device_train_batch_size),
    )
    return config.train()
