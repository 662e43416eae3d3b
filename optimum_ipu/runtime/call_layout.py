"""The layout of one host call: how its combined batch splits into micro-batches, and what it returns.

Both front ends build one: `IPUTrainer` from its `IPUConfig` (`CallLayout.from_ipu_config`), PopTorch's
wrappers from a `poptorch.Options` (device iterations, replicas, gradient accumulation). The runtime's
executables take it and nothing else, so neither front end imitates the other's configuration type.
"""

from __future__ import annotations

from dataclasses import dataclass

OUTPUT_MODES = ("final", "all", "sum", "default")


@dataclass(frozen=True)
class CallLayout:
    """One host call: `device_iterations` weight updates (training) or iterations (inference), each over
    `replication_factor` replicas of `gradient_accumulation_steps` micro-batches.

    Attributes:
        device_iterations: iterations per call.
        replication_factor: replicas (data-parallel copies) per iteration.
        gradient_accumulation_steps: micro-batches each replica sums before an update (1 in inference).
        output_mode: which micro-batches' losses a training call returns ("final", "all", "sum", "default").
    """

    device_iterations: int = 1
    replication_factor: int = 1
    gradient_accumulation_steps: int = 1
    output_mode: str = "final"

    def __post_init__(self) -> None:
        for name in ("device_iterations", "replication_factor", "gradient_accumulation_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CallLayout.{name} must be an integer >= 1, got {value!r}.")
        if self.output_mode not in OUTPUT_MODES:
            raise ValueError(f"output_mode must be one of {OUTPUT_MODES}, got {self.output_mode!r}.")

    @classmethod
    def from_ipu_config(cls, ipu_config) -> CallLayout:
        """The training call an `IPUConfig` describes (its training-mode values)."""
        return cls(
            device_iterations=ipu_config.device_iterations,
            replication_factor=ipu_config.replication_factor,
            gradient_accumulation_steps=ipu_config.gradient_accumulation_steps,
            output_mode=ipu_config.output_mode,
        )

    @property
    def micro_batches(self) -> int:
        """Micro-batches one call runs: iterations x replicas x accumulation."""
        return self.device_iterations * self.replication_factor * self.gradient_accumulation_steps

    def combined_batch(self, micro_batch_size: int) -> int:
        """Samples one call consumes."""
        return self.micro_batches * micro_batch_size
