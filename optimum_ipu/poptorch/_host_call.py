"""The batch arithmetic of a PopTorch host call: what its inputs hold, and in which order the runtime runs them.

A call's inputs hold, on dim 0, PopTorch's combined batch: [device iteration][accumulation step]
[replica group][micro-batch] (`inputReplicaGrouping` feeds one group's samples to each of its replicas).
The runtime's executables (`runtime.executor`, the ones IPUTrainer uses) take [device iteration]
[replica][accumulation step][micro-batch] and a `CallLayout`; `HostCall` builds both from the
`poptorch.Options`, checks the batch as PopTorch does, and gives the outputs back in PopTorch's order.

An input that requires grad is detached, as PopTorch detaches it (with its warning, once per wrapper):
no backward pass reaches a model's inputs, so the caller's tensor gets no `.grad`.

Under torchrun a process is handed its own replicas' samples (`_distributed.local_replicas`), or every
replica's when the processes run pipeline stages (`_stages`): then it keeps its pipeline's replicas.
"""

from __future__ import annotations

from typing import Any

import torch

from optimum_ipu.call_layout import CallLayout, InvalidBatchError
from optimum_ipu.poptorch import _distributed
from optimum_ipu.poptorch._logging import logger
from optimum_ipu.poptorch.enums import CommGroupType, OutputMode

__all__ = ["HostCall", "input_layout"]

INPUT_REQUIRES_GRAD = (  # PopTorch's warning, then where a gradient of an input can come from
    "Input tensor has requires_grad=True set. This tensor will be detached because backward pass via inputs "
    "is not supported. (Its .grad stays None: to get the gradient of an input, set requires_grad=True on it "
    "inside the model's forward and return the gradient as an output.)"
)


def input_layout(options, training: bool = True) -> CallLayout:
    """The micro-batches of distinct data a call's inputs hold: DI x (this process's replicas / input
    group size) x GA (GA is 1 in inference). A DataLoader's combined batch is `batch_size` times this."""
    options._check_input_grouping()
    ga = options.Training.gradient_accumulation if training else 1
    fed = options.replication_factor // options.input_group_size // _distributed.data_processes(options)
    return CallLayout(options.device_iterations, fed, ga)


class HostCall:
    """One host call of a `trainingModel` / `inferenceModel` under `options`.

    Attributes:
        inputs: the `input_layout` of a call (what its inputs hold).
        input_replicas: the replicas whose samples a call's inputs hold (all of them in one process).
        replicas: the replicas this process runs (those, or its pipeline's as a stage process).
        stage_processes: whether the processes run pipeline stages (each handed every replica's samples).
    """

    def __init__(self, options, training: bool):
        self.options = options
        self.training = training
        self.inputs = input_layout(options, training)
        self.input_replicas = _distributed.local_replicas(options)
        self.replicas = self.input_replicas
        self.stage_processes = False
        self._said_requires_grad = False

    def counts(self) -> tuple[int, int, int, int]:
        """(device iterations, accumulation steps, replicas, replicas fed distinct data)."""
        o = self.options
        ga = o.Training.gradient_accumulation if self.training else 1
        return o.device_iterations, ga, o.replication_factor, o.replication_factor // o.input_group_size

    def runtime_layout(self) -> CallLayout:
        """The layout the runtime's executable runs: in training, every replica of the run (the executable
        runs this process's share of them, `runtime.replicas`); in inference, the replicas whose samples
        this process is handed (each process returns its own rows, as a poprun instance does)."""
        di, ga, r, _ = self.counts()
        return CallLayout(di, r if self.training else len(self.input_replicas), ga)

    def run_as_stage_processes(self, stage_processes: bool) -> None:
        """Whether the processes run pipeline stages; either way this process runs its input replicas
        until `run_replicas` says which replicas its pipeline runs."""
        self.stage_processes = stage_processes
        self.replicas = self.input_replicas

    def run_replicas(self, replicas: range) -> None:
        """The replicas this process's pipeline runs (stage processes)."""
        self.replicas = replicas

    def micro_batch(self, leaves: list[Any]) -> list[Any]:
        """One micro-batch of each input (what a trace of the forward runs)."""
        per_call = self.inputs.micro_batches
        return [
            leaf[: max(1, leaf.shape[0] // per_call)]
            if isinstance(leaf, torch.Tensor) and leaf.dim()
            else leaf
            for leaf in leaves
        ]

    def check_batch(self, leaves: list[Any]) -> None:
        """PopTorch's error (its wording) for an input whose dim 0 is not a whole number of calls' samples
        (the rule is `CallLayout.micro_batch_size`'s; an empty input is left to the model)."""
        if not self._said_requires_grad and any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves):
            self._said_requires_grad = True
            logger.warning(INPUT_REQUIRES_GRAD)
        for leaf in leaves:
            if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0 or leaf.shape[0] == 0:
                continue
            try:
                self.inputs.micro_batch_size(leaf.shape[0])
            except InvalidBatchError:
                raise AssertionError(self._invalid_batch(list(leaf.shape))) from None

    def _invalid_batch(self, shape: list[int]) -> str:
        o, layout = self.options, self.inputs
        replicas = f"Options.replicationFactor({o.replication_factor})"
        if len(self.input_replicas) != o.replication_factor:
            replicas = f"{replicas} / processes({o.replication_factor // len(self.input_replicas)})"
        return (
            f"Invalid batch dimension: In the input {shape}, the batch dimension "
            f"({shape[0]}) must be a multiple of Options.deviceIterations({layout.device_iterations}) * "
            f"({replicas} / Options.inputReplicaGrouping.input_group_size({o.input_group_size})) * "
            f"Options.Training.gradientAccumulation({layout.gradient_accumulation_steps}) = {layout.micro_batches} "
            "because it is used to calculate the batch size which will be executed on the device in any given "
            "iteration. For a full explanation see the batching semantics page of the documentation."
        )

    def to_runtime_layout(self, leaf: Any) -> Any:
        """PopTorch's [DI][GA][R/g][mb] -> the runtime's [DI][R][GA][mb], each group's data to each replica
        (detached: no backward pass reaches an input, as on PopTorch)."""
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
            leaf = leaf.detach()
        if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0:
            return leaf
        di, ga, r, fed = self.counts()
        local = self.replicas
        if self.stage_processes and len(local) != r:  # every replica's samples: keep this pipeline's
            x = leaf.reshape(di, ga, r, -1, *leaf.shape[1:])[:, :, local.start : local.stop]
            leaf = x.reshape(-1, *leaf.shape[1:])
        if self.training and len(local) != r:  # torchrun: this process's replicas, at their runtime places
            x = leaf.reshape(di, ga, len(local), -1, *leaf.shape[1:]).transpose(1, 2)
            full = x.new_zeros((di, r, *x.shape[2:]))  # the other processes' replicas do not run here
            full[:, local.start : local.stop] = x
            return full.reshape(-1, *leaf.shape[1:])
        if fed != r:
            x = leaf.reshape(di, ga, fed, -1, *leaf.shape[1:])
            group = self.options.input_group_size
            if self.options.input_cgt == CommGroupType.Orthogonal:
                index = torch.arange(r, device=leaf.device) % fed
            else:
                index = torch.arange(r, device=leaf.device) // group
            leaf = x.index_select(2, index).reshape(-1, *leaf.shape[1:])
        if ga > 1 and r > 1:
            x = leaf.reshape(di, ga, r, -1, *leaf.shape[1:])
            leaf = x.transpose(1, 2).reshape(-1, *leaf.shape[1:])
        return leaf

    def to_poptorch_order(self, runtime_order: list[Any], replicas: int) -> list[Any]:
        """Micro-batch results in the runtime's [DI][R][GA] order -> PopTorch's [DI][GA][R] (`replicas` of them)."""
        di, ga, _, _ = self.counts()
        layout = CallLayout(di, replicas, ga)
        return [
            runtime_order[layout.first_micro_batch(d, k) + g]
            for d in range(di)
            for g in range(ga)
            for k in range(replicas)
        ]

    def output_mode(self) -> tuple[OutputMode, int]:
        """The call's output mode (the wrapper's options hold it resolved: `resolved_output_mode`) and period."""
        return self.options.output_mode, self.options.output_return_period


def resolved_output_mode(mode: OutputMode, training: bool) -> OutputMode:
    """PopTorch's output mode in effect: Default is Final in training, All in inference."""
    if mode == OutputMode.Default:
        return OutputMode.Final if training else OutputMode.All
    return mode
