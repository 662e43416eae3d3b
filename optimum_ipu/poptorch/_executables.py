"""What a PopTorch wrapper hands the runtime: the checks at wrap time, and the runtime's executable.

`trainingModel(model, options, optimizer)` and `inferenceModel(model, options)` run on the same
`TrainingExecutable` / `InferenceExecutable` as IPUTrainer. This module builds one for a compiled
wrapper: the call's layout (`_host_call`), the processes under torchrun (replica processes, or one
pipeline stage per process), the random streams of the replicas, and the optimizer's settings
(`_optimizer_use.training_settings`, the same function `setOptimizer` calls).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from optimum_ipu.poptorch import _anchors, _distributed, _stages
from optimum_ipu.poptorch._logging import Error
from optimum_ipu.poptorch._optimizer_use import (
    check_optimizer_parameters,
    hyperparameters_as_set,
    native_step,
    training_settings,
    warn_if_subclassed,
)
from optimum_ipu.poptorch._recompute import recomputing
from optimum_ipu.poptorch.enums import ReductionType
from optimum_ipu.poptorch.optim import AMSGRAD
from optimum_ipu.poptorch.options import device_seed
from optimum_ipu.runtime.distributed import build_process_replicas
from optimum_ipu.runtime.executor import InferenceExecutable, TrainingExecutable
from optimum_ipu.runtime.fp16_compute import resolve_fp16_compute
from optimum_ipu.runtime.replicas import ReplicaStreams

__all__ = ["build_executable", "check_wrap", "run_call"]

GA_INFERENCE = (
    "You must set poptorch.Options().Training.gradientAccumulation to 1 or leave it as its default value (1) "
    "when running a poptorch.inferenceModel(). Use poptorch.Options().deviceIterations to process a sufficient "
    "number of batches each run for pipelined execution instead."
)


def check_wrap(model: nn.Module, options, training: bool, optimizer):
    """PopTorch's checks when a module is wrapped; returns the optimizer a training model uses (SGD with
    lr 0.01, PopTorch's default, when none is given)."""
    if not training:
        if optimizer is not None:
            raise ValueError("An optimizer is given to poptorch.inferenceModel: inference updates no weights.")
        if options.Training.gradient_accumulation != 1:
            raise Error(GA_INFERENCE)
        return None
    if next(model.parameters(), None) is None:
        raise Error(
            f"The model ({type(model).__name__}) has no parameters: a poptorch.trainingModel has no weights "
            "to train. Use poptorch.inferenceModel to run it."
        )
    if optimizer is None:
        return torch.optim.SGD(model.parameters(), lr=0.01)
    if any(group.get("amsgrad") for group in optimizer.param_groups):
        raise ValueError(AMSGRAD)
    check_optimizer_parameters(model, optimizer)
    warn_if_subclassed(optimizer)
    return optimizer


def fp16_compute_of(model: nn.Module, mixed_precision: bool) -> str | None:
    """How fp16 ops are computed: None (plain dispatch) for a model with no fp16 weight or buffer whose
    inputs are of its precision, as IPUTrainer does with --fp32; the fp16 layer costs a dispatch per op,
    which fp32 models skip."""
    tensors = [*model.parameters(), *model.buffers()]
    if not mixed_precision and not any(t.dtype == torch.float16 for t in tensors):
        return None
    return resolve_fp16_compute(None, tensors[0].device)


def build_executable(wrapper) -> TrainingExecutable | InferenceExecutable:
    """The runtime's executable of a compiled `PoplarExecutor` (its trace, stage plan and host call set)."""
    call, model = wrapper._call, wrapper._user_model
    if not wrapper._training:
        return InferenceExecutable(
            wrapper._micro_model, call.runtime_layout(), fp16_compute=fp16_compute_of(model, wrapper._mixed_precision),
            cast_inputs=False,  # the wrapper feeds them by the IPU's types (`_ipu_types.as_fed`)
            sets_mode=False,  # PopTorch runs each module in the mode its user left it in
        )
    options = wrapper._options
    wrapper._streams = wrapper._streams or ReplicaStreams(device_seed(options), options.replication_factor)
    reduction = options.Training.accumulation_and_replication_reduction_type
    return TrainingExecutable(
        model, call.runtime_layout(), loss_fn=wrapper._training_loss, replicas=_processes(wrapper),
        streams=wrapper._streams, fp16_compute=fp16_compute_of(model, wrapper._mixed_precision), cast_inputs=False,
        sets_mode=False,
        reduction="sum" if reduction == ReductionType.Sum else "mean",
        measure_grad_norm=False,  # PopTorch returns no gradient norm: measured only to clip
        skip_non_finite_updates=False,  # the IPU applies an update with non-finite gradients (NaN weights)
        stages=wrapper._stages, optimizer=wrapper._optimizer,
        **training_settings(wrapper._optimizer, options, generators=wrapper._rounding_generators),
    )  # fmt: skip


def _processes(wrapper):
    """This process's `ProcessReplicas` under torchrun (None in one process), and its pipeline stage
    (`wrapper._stages`) when the processes run stages."""
    call, model = wrapper._call, wrapper._user_model
    replicas = wrapper._options.replication_factor
    wrapper._stages = None
    plan = wrapper._stage_plan
    if plan is None and len(call.replicas) == replicas:
        return None  # one process runs every replica
    # Stage processes (N consecutive ranks run one pipeline), or replica processes whose gradient sums
    # are all-reduced over the processes.
    _distributed.join_process_group()
    _distributed.broadcast_module(model)
    stages = plan.num_stages if plan is not None else 1
    device = wrapper._reference_tensor().device
    wrapper._process_replicas = wrapper._process_replicas or build_process_replicas(replicas, stages, device)
    processes = wrapper._process_replicas
    if plan is not None:
        call.run_replicas(processes.local_replicas(replicas))
        wrapper._stages = _stages.PopTorchStages(
            wrapper, plan, processes.stage, processes.pp_group, call.runtime_layout().gradient_accumulation_steps
        )
    return processes


def run_call(wrapper, batch: dict[str, Any], anchors: _anchors.AnchorRecorder) -> list[Any]:
    """One host call of a compiled wrapper on its runtime-ordered `batch`: every micro-batch's outputs, in
    PopTorch's [DI][GA][R] order (the training call's updates applied, anchors recorded)."""
    if wrapper._training:
        with (
            hyperparameters_as_set(wrapper._optimizer, wrapper._hyperparameters),
            native_step(wrapper._optimizer),
            recomputing(wrapper._recomputed),
            anchors.around_updates(wrapper._optimizer),
        ):
            wrapper._executable(batch)
        runtime_order = wrapper._recorded  # this process's replicas, [DI][R][GA]
        if wrapper._stages is not None:
            runtime_order = _stages.gather_stage_outputs(
                wrapper._stages, wrapper._process_replicas, runtime_order, wrapper._call
            )
            wrapper._stages.broadcast_weights()  # every process holds the whole updated model
        recorded = wrapper._call.to_poptorch_order(runtime_order, wrapper._output_count())
    else:
        wrapper._executable(batch)
        recorded = wrapper._recorded
        for _ in range(wrapper._call.inputs.device_iterations):
            anchors.record_weights()
    if wrapper._constants:  # outputs may be constants themselves: keep the values this call computed
        return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, recorded)
    # An output that is a weight or buffer (or a view of one) would follow it back to the host's value,
    # or change with the next call: PopTorch returns its value at the end of this call.
    held = wrapper._device_weights.storages()
    return pytree.tree_map(
        lambda t: t.clone() if isinstance(t, torch.Tensor) and _storage_of(t) in held else t, recorded
    )


def _storage_of(tensor: torch.Tensor) -> int:
    """The address of a tensor's storage (a view shares its base's)."""
    return tensor.untyped_storage().data_ptr()
