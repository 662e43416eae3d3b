"""`popart`: the PopART session-option enums that PopTorch programs pass to `poptorch.Options`.

Graphcore's PyTorch applications import the Poplar SDK's `popart` only for its enum constants, and
always hand them on as integers: `opts._Popart.set("subgraphCopyingStrategy",
int(popart.SubgraphCopyingStrategy.JustInTime))`, `opts.enableSyntheticData(int(
popart.SyntheticDataMode.RandomNormal))`. Those enums are here, as `enum.IntEnum`s with PopART's
Python member names and integer values, so such programs run unchanged; the top-level `popart`
package is this module. PopART's own graph and session API (`Builder`, `InferenceSession`,
`TrainingSession`, `DeviceManager`, ...) is not simulated: asking for it is an `AttributeError` that
says so and names PopTorch's API, which builds the model from PyTorch instead.

Source of the values: PopART 3.4.0's `willow/include/popart/sessionoptions.hpp` (the C++ enums, whose
members count up from the first's 0) and `python/popart/popart_core/popart.cpp` (the Python names:
`RecomputationType::None` is `NoRecompute`, `MergeVarUpdateType::None` is `Off`), in Graphcore's
public `graphcore/popart` repository. Every value below was read there; none is guessed.

PyPI's `popart` is an unrelated project (population-based training); this is the Poplar SDK's name.
"""

from __future__ import annotations

import enum

__all__ = [
    "AccumulateOuterFragmentSchedule",
    "BatchSerializationBatchSchedule",
    "BatchSerializationMethod",
    "BatchSerializationTransformContext",
    "ExecutionPhaseIOSchedule",
    "ExecutionPhaseSchedule",
    "Instrumentation",
    "MeanReductionStrategy",
    "MergeVarUpdateType",
    "RecomputationType",
    "SubgraphCopyingStrategy",
    "SyntheticDataMode",
    "VirtualGraphMode",
    "__version__",
    "versionString",
]

# PopART 3.4.0, the release whose enums these are (PopTorch 3.4 is what optimum-ipu simulates); the local
# label says whose stand-in it is, as `poptorch.__version__` does.
__version__ = "3.4.0+optimum_ipu"


def versionString() -> str:
    """PopART's version call: the release whose enums this stand-in carries, and that it is a stand-in."""
    return f"{__version__} (optimum-ipu's stand-in for the Poplar SDK's popart: session-option enums only)"


class AccumulateOuterFragmentSchedule(enum.IntEnum):
    """How the accumulate-outer fragment of a pipeline is scheduled (`accumulateOuterFragmentSettings`)."""

    Scheduler = 0
    Serial = 1
    OverlapCycleOptimized = 2
    OverlapMemoryOptimized = 3


class BatchSerializationBatchSchedule(enum.IntEnum):
    """How batch-serialized sub-graphs are scheduled before outlining."""

    Scheduler = 0
    Isomorphic = 1
    OverlapOnIo = 2
    OverlapOnCompute = 3


class BatchSerializationMethod(enum.IntEnum):
    """How a batch-serialized op is unrolled or looped."""

    UnrollDynamic = 0
    UnrollStatic = 1
    Loop = 2


class BatchSerializationTransformContext(enum.IntEnum):
    """When batch serialization applies; PopART's Python binding has both spellings of each member."""

    Fwd = 0
    Bwd = 1
    Forward = 0
    Backward = 1


class ExecutionPhaseIOSchedule(enum.IntEnum):
    """When a phased-execution tensor is loaded."""

    Preload = 0
    OnDemand = 1


class ExecutionPhaseSchedule(enum.IntEnum):
    """The order of the optimizer steps of the weights of one execution phase."""

    Interleaving = 0
    Batch = 1
    BatchClusteredIO = 2


class Instrumentation(enum.IntEnum):
    """Which loop a hardware cycle counter instruments."""

    Outer = 0
    Inner = 1


class MeanReductionStrategy(enum.IntEnum):
    """When a mean reduction over accumulated tensors divides."""

    Running = 0
    Post = 1


class MergeVarUpdateType(enum.IntEnum):
    """Which weight-update ops are merged (`Off` is C++'s `None`)."""

    Off = 0
    All = 1
    AutoLoose = 2
    AutoTight = 3


class RecomputationType(enum.IntEnum):
    """What `autoRecomputation` recomputes in the backward pass (`NoRecompute` is C++'s `None`).

    The simulated IPU reads only whether it is set: any value but `NoRecompute` turns recomputation on.
    """

    NoRecompute = 0
    Standard = 1
    NormOnly = 2
    Pipeline = 3
    RecomputeAll = 4


class SubgraphCopyingStrategy(enum.IntEnum):
    """When a sub-graph's inputs and outputs are copied."""

    OnEnterAndExit = 0
    JustInTime = 1


class SyntheticDataMode(enum.IntEnum):
    """What feeds the inputs instead of the host (`enableSyntheticData`); `Off` uses real data."""

    Off = 0
    Zeros = 1
    RandomNormal = 2
    RandomUniform = 3


class VirtualGraphMode(enum.IntEnum):
    """How ops are placed on IPUs (virtual graphs)."""

    Off = 0
    Manual = 1
    Auto = 2
    ExecutionPhases = 3


def __getattr__(name: str):
    """Any other PopART name: an `AttributeError` saying that PopART's own API is not simulated, and what is."""
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"popart.{name} is not provided: optimum-ipu's popart holds only the session-option enums PopTorch "
        f"programs pass to poptorch.Options ({', '.join(n for n in __all__ if n[0].isupper())}); PopART's "
        "graph and session API (Builder, sessions, devices, tensors) is not simulated. Build the model in "
        "PyTorch and run it with poptorch.trainingModel / poptorch.inferenceModel."
    )
