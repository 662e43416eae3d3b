"""PopTorch's API on the simulated IPU: `import poptorch` programs run unchanged on a CPU or GPU.

A second front end on the runtime that runs IPUTrainer (see `optimum_ipu/runtime/`): `Options`,
`DataLoader`, `trainingModel`/`inferenceModel`, blocks and stages, `poptorch.optim`. The top-level
`poptorch` package shipped with optimum-ipu is this module under PopTorch's name. What runs, what is
simulated and what has no effect here: docs/poptorch.md.
"""

from optimum_ipu.poptorch import (
    _torch_ops,  # noqa: F401 - registers torch.ops.poptorch.* (name scopes, casts)
    control_flow,
    enums,
    ops,
    optim,
    scopes,
    tensor_ops,
)
from optimum_ipu.poptorch._annotations import BeginBlock, Block, BlockFunction, removeBlocks
from optimum_ipu.poptorch._compile_hooks import registerPostCompileHook, registerPreCompileHook
from optimum_ipu.poptorch._dataloader import AsynchronousDataAccessor, DataLoader
from optimum_ipu.poptorch._export import load
from optimum_ipu.poptorch._ipu_context import isRunningOnIpu
from optimum_ipu.poptorch._logging import Error, RecoverableError, UnrecoverableError, logger, setLogLevel
from optimum_ipu.poptorch._poplar_executor import PoplarExecutor, inferenceModel, trainingModel
from optimum_ipu.poptorch._printing import module_repr
from optimum_ipu.poptorch._printing import print as print  # noqa: A004 - PopTorch's poptorch.print, kept out of __all__
from optimum_ipu.poptorch.attributes import Attribute
from optimum_ipu.poptorch.blocks import (
    ParallelPhasedExecution,
    Phase,
    PipelinedExecution,
    SerialPhasedExecution,
    ShardedExecution,
    Stage,
)
from optimum_ipu.poptorch.cluster_ops import fps, nearest
from optimum_ipu.poptorch.control_flow import CPU, cond, for_loop
from optimum_ipu.poptorch.ctc_decoder import ctc_beam_search_decoder
from optimum_ipu.poptorch.custom_args import ICustomArgParser, registerCustomArgParser
from optimum_ipu.poptorch.enums import (
    AutoStage,
    CommGroupType,
    ConnectionType,
    DataLoaderMode,
    HalfFloatCastingBehavior,
    Liveness,
    MatMulSerializationMode,
    MeanReductionStrategy,
    MultiConvPlanType,
    OutputMode,
    OverlapMode,
    ReductionType,
    SharingStrategy,
    SyncPattern,
    VariableRetrievalMode,
)
from optimum_ipu.poptorch.ops import (
    custom_op,
    identity_loss,
    ipu_print_tensor,
    nop,
    recomputationCheckpoint,
    serializedMatMul,
    set_available_memory,
    set_overlap_for_input,
    set_overlap_for_output,
)
from optimum_ipu.poptorch.options import Options, TensorLocationSettings
from optimum_ipu.poptorch.scopes import MultiConv, NameScope
from optimum_ipu.poptorch.tensor_ops import dynamic_slice, dynamic_update

__version__ = "3.4.0+optimum_ipu"


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:
    """Whether `num_ipus` IPUs can be used: the simulated IPU provides up to 64 per process (PopTorch's limit)."""
    return 0 < num_ipus <= 64


def ipuHardwareVersion() -> int:
    """The IPU version the programs run on: 2 (Mk2 GC200, which the simulated IPU models)."""
    return 2


__all__ = [
    "AsynchronousDataAccessor",
    "Attribute",
    "AutoStage",
    "BeginBlock",
    "Block",
    "BlockFunction",
    "CPU",
    "CommGroupType",
    "ConnectionType",
    "DataLoader",
    "DataLoaderMode",
    "Error",
    "HalfFloatCastingBehavior",
    "ICustomArgParser",
    "Liveness",
    "MatMulSerializationMode",
    "MeanReductionStrategy",
    "MultiConv",
    "MultiConvPlanType",
    "NameScope",
    "Options",
    "OutputMode",
    "OverlapMode",
    "ParallelPhasedExecution",
    "Phase",
    "PipelinedExecution",
    "PoplarExecutor",
    "RecoverableError",
    "ReductionType",
    "SerialPhasedExecution",
    "ShardedExecution",
    "SharingStrategy",
    "Stage",
    "SyncPattern",
    "TensorLocationSettings",
    "UnrecoverableError",
    "VariableRetrievalMode",
    "cond",
    "control_flow",
    "ctc_beam_search_decoder",
    "custom_op",
    "dynamic_slice",
    "dynamic_update",
    "enums",
    "for_loop",
    "fps",
    "identity_loss",
    "inferenceModel",
    "ipuHardwareIsAvailable",
    "ipuHardwareVersion",
    "ipu_print_tensor",
    "isRunningOnIpu",
    "load",
    "logger",
    "module_repr",
    "nearest",
    "nop",
    "ops",
    "optim",
    "recomputationCheckpoint",
    "registerCustomArgParser",
    "registerPostCompileHook",
    "registerPreCompileHook",
    "removeBlocks",
    "scopes",
    "serializedMatMul",
    "setLogLevel",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
    "tensor_ops",
    "trainingModel",
]
