"""What runs on the IPUs: the IPU config's settings for one mode, normalised for the hardware models.

`Workload.from_ipu_config` reads an `IPUConfig` (or any object with the same attribute names: the
models only read attributes) in its *current* mode, so a config switched to `.eval()` gives the
inference values. Everything downstream reads a `Workload`, never the config, so the memory and
performance models have one place where defaults and per-IPU expansions happen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from optimum_ipu.call_layout import CallLayout
from optimum_ipu.configuration.schema import FIELD_DEFAULTS

OPTIMIZERS = ("adamw", "adam", "lamb", "sgd")
OUTPUT_MODES = ("all", "final", "sum", "everyn")


@dataclass(frozen=True)
class StateTypes:
    """Bytes per trainable weight of the optimizer's state, by PopTorch's three state types.

    Attributes:
        accumulator: the gradient accumulator (`accum_type`), which sums an update's micro-batch
            gradients when gradient accumulation is on.
        first_moment: Adam's and LAMB's first moment (`first_order_momentum_accum_type`).
        second_moment: their second moment (`second_order_momentum_accum_type`).
    """

    accumulator: int
    first_moment: int
    second_moment: int

    @classmethod
    def of_optimizer(cls, optimizer) -> StateTypes:
        """The state types `optimizer` keeps: its `accum_type` and its moment types (`accum_types` on
        `poptorch.optim`'s SGD, Adam, AdamW and RMSprop; per parameter group on the IPU optimizers and
        PopTorch's LAMB), fp32 where it names none, as a torch optimizer keeps its state."""
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
        group = (getattr(optimizer, "param_groups", None) or [{}])[0]
        types = getattr(optimizer, "accum_types", None) or group

        def size(dtype) -> int:  # a torch dtype's bytes (fp16 2, fp32 4); none named: fp32
            return dtype.itemsize if dtype is not None else 4

        return cls(
            size(getattr(optimizer, "accum_type", None)),
            size(types.get("first_order_momentum_accum_type")),
            size(types.get("second_order_momentum_accum_type")),
        )

    @classmethod
    def optimum_graphcore(cls, fp32: bool) -> StateTypes:
        """Optimum Graphcore 0.7's `create_optimizer` (and IPUTrainer's): fp16 training keeps the
        accumulator and the first moment in fp16 and the second moment in fp32; `--fp32`, all fp32."""
        return cls(4, 4, 4) if fp32 else cls(2, 2, 4)

    @classmethod
    def all_fp32(cls) -> StateTypes:
        """PopTorch's optimizers by default, or an fp16 run priced with fp32 state (`plan --fp32-optimizer-state`)."""
        return cls(4, 4, 4)


def _attr(config, name: str):
    """`config.<name>` in its current mode; the field's default (`schema.FIELDS`) where unset or absent."""
    value = getattr(config, name, None)
    return FIELD_DEFAULTS[name] if value is None else value


def expand_matmul_proportion(value, ipus: int) -> tuple[float, ...]:
    """One matmul proportion per IPU from a float or a per-IPU list."""
    if isinstance(value, (int, float)):
        return (float(value),) * ipus
    values = tuple(float(v) for v in value)
    if len(values) == 1:
        return values * ipus
    if len(values) != ipus:
        raise ValueError(
            f"matmul_proportion={list(values)} needs one value per IPU ({ipus} IPUs per replica)."
        )
    return values


def _published_state_types(ipu_config, fp32: bool) -> StateTypes:
    types = StateTypes.optimum_graphcore(fp32)
    half = getattr(ipu_config, "enable_half_first_order_momentum", None)
    if half is None or fp32:
        return types
    return dataclasses.replace(types, first_moment=2 if half else 4)


@dataclass(frozen=True)
class Workload:
    """The settings the memory and performance models need, for one mode (training or inference).

    Attributes:
        micro_batch_size: samples per micro-batch (per replica, per pipeline step).
        gradient_accumulation_steps: micro-batches per weight update (1 in inference).
        replication_factor: data-parallel replicas.
        device_iterations: weight updates (or inference steps) per host call.
        ipus_per_replica: IPUs in one pipeline.
        matmul_proportion: per IPU, the fraction of memory matmul temporaries may use.
        optimizer_state_offchip: optimizer state in Streaming Memory instead of on chip.
        replicated_tensor_sharding: optimizer state sharded across replicas.
        embedding_factor: pieces the word embedding (and a tied head) is serialized into.
        embedding_splits_per_ipu: how many of those pieces each IPU holds, or None (all on the
            embedding's IPU).
        projection_factor: pieces an output projection not tied to the word embedding (MT5's LM head)
            is serialized into (`projection_serialization_factor`, or the sum of its splits per IPU).
        recompute_checkpoint_every_layer: a recomputation checkpoint after every layer.
        training: training (pipelined, with backward) or inference.
        pipelined_inference: inference overlaps the stages across device iterations (PopTorch's
            `PipelinedExecution`). False by default: Optimum Graphcore's `IPUConfig.to_options(
            for_inference=True)` sets `ShardedExecution`, so each micro-batch visits the IPUs in turn.
        output_mode: which micro-batches' outputs a call streams back to the host, PopTorch's
            `OutputMode` in lower case: "all" (every micro-batch: inference's default, which
            `IPUConfig.to_options(for_inference=True)` sets), "final" (the last of each replica), "sum"
            (one sum per replica) or "everyn" (every `output_period`-th device iteration). Training
            returns only its loss whatever the mode.
        output_period: N of "everyn".
        async_data_loading: the host prepares the next call while the IPUs run this one (PopTorch's
            `DataLoaderMode.Async`, or an `AsynchronousDataAccessor`), so its fixed work per call
            overlaps the IPUs' instead of adding to it. False by default: IPUTrainer's evaluation
            loader is `DataLoaderMode.Sync`.
        processes: host processes the replicas are split over, in all (`poprun --num-instances`,
            torchrun's processes). Each runs its own Poplar stream callbacks, so the host copies the
            streams of one process's replicas one after another and those of different processes at
            once. Fewer processes than hosts count as one a host (each host runs at least one); 1 by
            default. At most the replication factor: a process drives at least one replica.
        optimizer: "adamw", "adam", "lamb" or "sgd".
        fp32: compute in fp32 instead of fp16.
        state_types: bytes of the optimizer's gradient accumulator and moments per trainable weight;
            Optimum Graphcore's types for the precision when not given (`StateTypes.optimum_graphcore`).
    """

    micro_batch_size: int
    gradient_accumulation_steps: int = 1
    replication_factor: int = 1
    device_iterations: int = 1
    ipus_per_replica: int = 1
    matmul_proportion: tuple[float, ...] = (0.2,)
    optimizer_state_offchip: bool = False
    replicated_tensor_sharding: bool = False
    embedding_factor: int = 1
    embedding_splits_per_ipu: tuple[int, ...] | None = None
    projection_factor: int = 1
    recompute_checkpoint_every_layer: bool = False
    training: bool = True
    pipelined_inference: bool = False
    output_mode: str = "all"
    output_period: int = 1
    async_data_loading: bool = False
    processes: int = 1
    optimizer: str = "adamw"
    fp32: bool = False
    state_types: StateTypes | None = None

    def __post_init__(self):
        if self.state_types is None:
            object.__setattr__(self, "state_types", StateTypes.optimum_graphcore(self.fp32))
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r}: choose one of {', '.join(OPTIMIZERS)}.")
        if self.output_mode not in OUTPUT_MODES:
            raise ValueError(f"output_mode={self.output_mode!r}: choose one of {', '.join(OUTPUT_MODES)}.")
        if not 1 <= self.processes <= self.replication_factor:
            raise ValueError(
                f"processes={self.processes}: give between 1 and the {self.replication_factor} replicas; a host "
                "process drives at least one replica."
            )
        if self.output_period < 1:
            raise ValueError(
                f"output_period={self.output_period}: give a positive number of device iterations."
            )
        if len(self.matmul_proportion) != self.ipus_per_replica:
            object.__setattr__(
                self,
                "matmul_proportion",
                expand_matmul_proportion(self.matmul_proportion, self.ipus_per_replica),
            )

    @classmethod
    def from_ipu_config(
        cls,
        ipu_config,
        *,
        micro_batch_size: int,
        training: bool = True,
        optimizer: str = "adamw",
        fp32: bool = False,
        ipus_per_replica: int | None = None,
        pipelined_inference: bool = False,
        state_types: StateTypes | None = None,
    ) -> Workload:
        """Read `ipu_config` in its current mode; `ipus_per_replica` defaults to the config's.

        `pipelined_inference`: inference as PopTorch's `PipelinedExecution` (the stages overlap across
        device iterations) instead of Optimum Graphcore's sharded inference. `state_types`: the
        optimizer's state types (default: Optimum Graphcore's for the precision; an older config's
        `enable_half_first_order_momentum`, where a run published one, sets the first moment's).
        """
        ipus = int(ipus_per_replica or _attr(ipu_config, "ipus_per_replica") or 0)
        if ipus < 1:
            ipus = len(_attr(ipu_config, "layers_per_ipu"))
        splits = _attr(ipu_config, "serialized_embedding_splits_per_ipu")
        splits = tuple(int(s) for s in splits) if splits else None
        factor = sum(splits) if splits else int(_attr(ipu_config, "embedding_serialization_factor") or 1)
        projection_splits = _attr(ipu_config, "serialized_projection_splits_per_ipu")
        projection = (
            sum(projection_splits)
            if projection_splits
            else int(_attr(ipu_config, "projection_serialization_factor") or 1)
        )
        return cls(
            micro_batch_size=int(micro_batch_size),
            gradient_accumulation_steps=int(_attr(ipu_config, "gradient_accumulation_steps"))
            if training
            else 1,
            replication_factor=int(_attr(ipu_config, "replication_factor")),
            device_iterations=int(_attr(ipu_config, "device_iterations")),
            ipus_per_replica=ipus,
            matmul_proportion=expand_matmul_proportion(_attr(ipu_config, "matmul_proportion"), ipus),
            optimizer_state_offchip=bool(_attr(ipu_config, "optimizer_state_offchip")),
            replicated_tensor_sharding=bool(_attr(ipu_config, "replicated_tensor_sharding")),
            embedding_factor=max(int(factor), 1),
            embedding_splits_per_ipu=splits,
            projection_factor=max(int(projection), 1),
            recompute_checkpoint_every_layer=bool(_attr(ipu_config, "recompute_checkpoint_every_layer")),
            training=training,
            optimizer=optimizer.lower(),
            fp32=fp32,
            state_types=state_types or _published_state_types(ipu_config, fp32),
            pipelined_inference=pipelined_inference and not training,
        )

    @property
    def optimizer_state_bytes(self) -> int:
        """Bytes of optimizer state per trainable weight: Adam's and LAMB's two moments, none for SGD."""
        if self.optimizer == "sgd":
            return 0
        return self.state_types.first_moment + self.state_types.second_moment

    @property
    def recomputation(self) -> bool:
        """Recompute activations in backward: PopTorch's default for pipelines, or asked per layer."""
        return self.training and (self.ipus_per_replica > 1 or self.recompute_checkpoint_every_layer)

    def recomputes(self, stage: int, stages: int | None = None) -> bool:
        """Whether pipeline stage `stage` (of `stages`, one per IPU unless given) recomputes its forward
        in backward.

        Every stage but the last stashes its inputs and recomputes; the last runs forward and backward
        of a micro-batch in the same cycle and keeps its activations, unless every layer is a
        checkpoint, which asks for recomputation there too (and for a single IPU). With a head tied to
        the embedding the last stage is that head on IPU 0, so the last IPU's layers recompute.
        """
        last = stage == (stages or self.ipus_per_replica) - 1
        return self.recomputation and (not last or self.recompute_checkpoint_every_layer)

    @property
    def float_bytes(self) -> int:
        return 4 if self.fp32 else 2

    @property
    def total_ipus(self) -> int:
        return self.ipus_per_replica * self.replication_factor

    @property
    def samples_per_call(self) -> int:
        """The combined batch: micro-batch x GA x replicas x device iterations (the call's `CallLayout`)."""
        layout = CallLayout(self.device_iterations, self.replication_factor, self.gradient_accumulation_steps)
        return layout.combined_batch(self.micro_batch_size)

    @property
    def returned_micro_batches(self) -> int:
        """Micro-batches per replica whose outputs one inference call streams back, by `output_mode`
        (PopTorch's selection, `optimum_ipu.poptorch._outputs.select_outputs`, with no gradient
        accumulation in inference): all DI of them, one for "final" and "sum", DI // N for "everyn"."""
        di = self.device_iterations
        if self.output_mode == "all":
            return di
        if self.output_mode == "everyn":
            return di // self.output_period
        return 1

    def stash_depth(self, stage: int, stages: int | None = None) -> int:
        """Micro-batches in flight at pipeline stage `stage` (of `stages`, one per IPU unless given)
        between its forward and its backward: 2(S-k)-1."""
        return 2 * ((stages or self.ipus_per_replica) - stage) - 1 if self.training else 0

    def replace(self, **changes) -> Workload:
        """A copy with `changes` applied (e.g. another matmul_proportion)."""
        return dataclasses.replace(self, **changes)

    def with_matmul_proportion(self, values: Sequence[float] | float) -> Workload:
        return self.replace(matmul_proportion=expand_matmul_proportion(values, self.ipus_per_replica))
