"""PopTorch's enumerations, with PopTorch's names and integer values (scripts compare and store them)."""

from __future__ import annotations

import enum

__all__ = [
    "AutoStage",
    "CommGroupType",
    "ConnectionType",
    "DataLoaderMode",
    "HalfFloatCastingBehavior",
    "Liveness",
    "MatMulSerializationMode",
    "MeanReductionStrategy",
    "MultiConvPlanType",
    "OutputMode",
    "OverlapMode",
    "ReductionType",
    "SharingStrategy",
    "SyncPattern",
    "VariableRetrievalMode",
]


class MeanReductionStrategy(enum.IntEnum):
    """How a mean over accumulation steps and replicas is taken (all give the same value here)."""

    Running = 0
    Post = 1
    PostAndLoss = 2


class DataLoaderMode(enum.IntEnum):
    """`Sync`: batches built in the calling process; `Async`/`AsyncRebatched`: built ahead by a worker."""

    Sync = 0
    Async = 1
    AsyncRebatched = 2


class SharingStrategy(enum.IntEnum):
    """How an asynchronous data worker hands its batches over."""

    SharedMemory = 0
    FileSystem = 1
    Fork = 2
    ForkServer = 3


class OutputMode(enum.IntEnum):
    """Which micro-batches' outputs a call returns: `Default` is `Final` in training, `All` in inference."""

    Final = 0
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


class ConnectionType(enum.IntEnum):
    """When the process attaches to IPUs (no IPUs are attached here: every choice runs)."""

    Always = 0
    OnDemand = 1
    Never = 2


class HalfFloatCastingBehavior(enum.IntEnum):
    """Casting of mixed fp16/fp32 op inputs; PyTorch's rule (upcast) is the one that runs."""

    FloatDowncastToHalf = 0
    HalfUpcastToFloat = 1
    Default = 2


class ReductionType(enum.IntEnum):
    """How gradients combine over accumulation steps and replicas (and `identity_loss`'s reduction)."""

    Sum = 0
    Mean = 1
    NoReduction = 2


class SyncPattern(enum.IntEnum):
    """IPU synchronisation pattern (no effect on the simulated IPU)."""

    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


class MatMulSerializationMode(enum.Enum):
    """Which dimension `serializedMatMul` splits."""

    InputChannels = "input_channels"
    ReducingDim = "reducing_dim"
    OutputChannels = "output_channels"
    Disabled = "none"


class Liveness(enum.IntEnum):
    """When phased execution moves tensors off chip."""

    AlwaysLive = 0
    OffChipAfterFwd = 1
    OffChipAfterFwdNoOverlap = 2
    OffChipAfterEachPhase = 3


class OverlapMode(enum.Enum):
    """Overlap of host I/O with compute on I/O tiles."""

    NoOverlap = "no_overlap"
    OverlapAccumulationLoop = "overlap_accumulation_loop"
    OverlapDeviceIterationLoop = "overlap_device_iteration_loop"


class AutoStage(enum.IntEnum):
    """How blocks without an explicit stage get one: stage id = IPU id, or a new stage per block."""

    SameAsIpu = 0
    AutoIncrement = 1


class MultiConvPlanType(enum.IntEnum):
    """How a `poptorch.MultiConv` runs its convolutions: in parallel (the default) or one by one."""

    Parallel = 0
    Serial = 1


class CommGroupType(enum.IntEnum):
    """How replicas are grouped (`inputReplicaGrouping`)."""

    All = 0
    Consecutive = 1
    Orthogonal = 2
    NoGrouping = 3


class VariableRetrievalMode(enum.IntEnum):
    """Which replicas' values of a replica-grouped weight are read back: one per group, or every replica's."""

    OnePerGroup = 0
    AllReplicas = 2
