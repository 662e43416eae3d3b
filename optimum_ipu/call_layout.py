"""The layout of one host call, and every rule on its numbers: the one place they are multiplied out.

A host call runs `device_iterations` iterations; in each, `replication_factor` replicas each run
`gradient_accumulation_steps` micro-batches (1 in inference) before the update. Its combined batch is
laid out [device iteration][replica][accumulation step][micro-batch] on dim 0.

Both front ends build one: `IPUTrainer` from its `IPUConfig` (`CallLayout.from_ipu_config`), PopTorch's
wrappers from a `poptorch.Options`. The runtime's executables keep it, and everything else that needs
the call's arithmetic asks it: `IPUConfig.batch_size_factor`, PopTorch's DataLoader, the checkpoint
set-up check, the processes' replica slices. Only the cost model prices a call itself, from its own
`Workload`. This module imports nothing of the package, so every room may use it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CallLayout", "InvalidBatchError", "replicas_of_process"]


class InvalidBatchError(ValueError):
    """A batch whose size is not a whole number of the call's micro-batches."""


@dataclass(frozen=True)
class CallLayout:
    """One host call: `device_iterations` weight updates (training) or iterations (inference), each over
    `replication_factor` replicas of `gradient_accumulation_steps` micro-batches.

    Attributes:
        device_iterations: iterations per call.
        replication_factor: replicas (data-parallel copies) per iteration.
        gradient_accumulation_steps: micro-batches each replica sums before an update (1 in inference).
    """

    device_iterations: int = 1
    replication_factor: int = 1
    gradient_accumulation_steps: int = 1

    def __post_init__(self) -> None:
        for name in ("device_iterations", "replication_factor", "gradient_accumulation_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CallLayout.{name} must be an integer >= 1, got {value!r}.")

    @classmethod
    def from_ipu_config(cls, ipu_config, for_inference: bool = False) -> CallLayout:
        """The call an `IPUConfig` describes: its training values, or its inference ones (no accumulation).

        Reads the attributes directly (`vars`), so the answer does not depend on the config's current mode.
        """
        values = vars(ipu_config)
        if for_inference:
            return cls(values["inference_device_iterations"], values["inference_replication_factor"], 1)
        return cls(
            values["device_iterations"], values["replication_factor"], values["gradient_accumulation_steps"]
        )

    # -- counts -------------------------------------------------------------------------------------
    @property
    def micro_batches(self) -> int:
        """Micro-batches one call runs: iterations x replicas x accumulation (the combined batch's factor)."""
        return self.device_iterations * self.replication_factor * self.gradient_accumulation_steps

    @property
    def micro_batches_per_update(self) -> int:
        """Micro-batches whose gradients one update sums: replicas x accumulation."""
        return self.replication_factor * self.gradient_accumulation_steps

    def combined_batch(self, micro_batch_size: int) -> int:
        """Samples one call consumes."""
        return self.micro_batches * micro_batch_size

    def describe(self, micro_batch_size: int = 1, training: bool = True) -> str:
        """The combined batch's arithmetic as text, e.g. "micro-batch 2 × gradient accumulation 16 ×
        replicas 4 × device iterations 1 = 128" (an inference call names no accumulation)."""
        factors = [("micro-batch", micro_batch_size)]
        if training:
            factors.append(("gradient accumulation", self.gradient_accumulation_steps))
        factors += [("replicas", self.replication_factor), ("device iterations", self.device_iterations)]
        return " × ".join(f"{name} {value}" for name, value in factors) + f" = {self.combined_batch(micro_batch_size)}"

    def gradient_divisor(self, reduction: str = "mean") -> int:
        """What the summed gradients of an update are divided by: replicas x accumulation for PopTorch's
        mean reduction (the default of both front ends), 1 for its sum."""
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}.")
        return self.micro_batches_per_update if reduction == "mean" else 1

    def first_micro_batch(self, iteration: int, replica: int) -> int:
        """The index, among the call's micro-batches, of replica `replica`'s first one in iteration `iteration`."""
        return (iteration * self.replication_factor + replica) * self.gradient_accumulation_steps

    def replica_of(self, index: int) -> int:
        """The replica that runs micro-batch `index` of the call, in the runtime's [DI][R][GA] order (the
        inverse of `first_micro_batch`, for state a replica keeps for itself)."""
        return (index // self.gradient_accumulation_steps) % self.replication_factor

    def poptorch_index(self, iteration: int, step: int, replica: int) -> int:
        """The index of a micro-batch in PopTorch's order, [iteration][accumulation step][replica] (how a
        PopTorch program's inputs are laid out and its outputs returned)."""
        return (iteration * self.gradient_accumulation_steps + step) * self.replication_factor + replica

    # -- the combined batch ---------------------------------------------------------------------------
    def micro_batch_size(self, combined_batch_size: int) -> int:
        """The micro-batch size of a combined batch of `combined_batch_size` samples.

        Raises:
            InvalidBatchError: the size is 0 or not a multiple of `micro_batches` ("Invalid batch dimension").
        """
        per_call = self.micro_batches
        if combined_batch_size % per_call or combined_batch_size == 0:
            raise InvalidBatchError(
                f"Invalid batch dimension: the combined batch of {combined_batch_size} samples is not a multiple "
                f"of device_iterations ({self.device_iterations}) x replicas ({self.replication_factor}) x "
                f"gradient_accumulation_steps ({self.gradient_accumulation_steps}) = {per_call}. Feed combined "
                f"batches of micro_batch_size x {per_call} samples (IPUTrainer's data loaders do)."
            )
        return combined_batch_size // per_call

    # -- processes --------------------------------------------------------------------------------
    def with_replicas(self, replication_factor: int) -> CallLayout:
        """The same call over `replication_factor` replicas (a process's share of them)."""
        return CallLayout(self.device_iterations, replication_factor, self.gradient_accumulation_steps)


def replicas_of_process(replication_factor: int, processes: int, index: int) -> range:
    """The replicas process `index` of `processes` runs when the processes share the replicas out.

    Consecutive slices, so replica r sees the samples it sees in one process: the rule of torchrun's
    data-parallel ranks (`runtime.distributed.ProcessReplicas`), poprun's instances and PopTorch's
    DataLoader under them (`poptorch._distributed`). `processes` must divide the replicas.
    """
    if processes < 1 or replication_factor % processes:
        raise ValueError(
            f"{processes} processes cannot share replication_factor={replication_factor} out: the replicas "
            "must be a multiple of the processes."
        )
    if not 0 <= index < processes:
        raise ValueError(f"process index {index} is outside 0..{processes - 1}.")
    per_process = replication_factor // processes
    return range(index * per_process, (index + 1) * per_process)
