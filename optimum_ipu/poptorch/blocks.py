"""Execution strategies and stages: how PopTorch groups a model's blocks onto IPUs.

`PipelinedExecution` (PopTorch's default) and `ShardedExecution` take stages or block ids; blocks
not named in a stage get one by the `AutoStage` rule (stage id = IPU id, or a new stage per block).
The phased strategies are accepted, and run as sharded execution (the same arithmetic).
"""

from __future__ import annotations

from optimum_ipu.poptorch._annotations import check_ipu_id
from optimum_ipu.poptorch.enums import AutoStage

__all__ = [
    "ParallelPhasedExecution",
    "Phase",
    "PipelinedExecution",
    "SerialPhasedExecution",
    "ShardedExecution",
    "Stage",
]


class Stage:
    """A group of blocks (by user id) that run together on one IPU: `Stage("enc0", "enc1").ipu(1)`."""

    def __init__(self, *block_ids: str):
        self._blocks = [str(b) for b in block_ids]
        self._ipu: int | None = None
        self._stage_id: int | None = None

    @property
    def blocks(self) -> list[str]:
        return list(self._blocks)

    def ipu(self, ipu: int) -> Stage:
        """Place the stage's blocks on IPU `ipu` (a non-negative integer; anything else is an `Error`)."""
        self._ipu = check_ipu_id(ipu, f"Stage({', '.join(map(repr, self._blocks))}).ipu")
        return self

    def __repr__(self) -> str:
        return f"Stage({', '.join(map(repr, self._blocks))}).ipu({self._ipu})"


class _ExecutionStrategy:
    """Base of the strategies: stages given explicitly, and the AutoStage rule for the others."""

    def __init__(self, *args, auto_stage: AutoStage = AutoStage.SameAsIpu):
        stages = []
        for arg in args:
            if isinstance(arg, AutoStage):
                auto_stage = arg
            elif isinstance(arg, Stage):
                stages.append(arg)
            elif isinstance(arg, (list, tuple)):
                stages.append(Stage(*arg))
            else:
                stages.append(Stage(arg))
        self.stages = stages
        self.auto_stage = AutoStage(auto_stage)

    def stage(self, block_id: str) -> Stage:
        """The stage block `block_id` belongs to (to place it: `strategy.stage("B1").ipu(0)`)."""
        for stage in self.stages:
            if str(block_id) in stage._blocks:
                return stage
        raise AssertionError(f"Unknown block {block_id}")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({', '.join(map(repr, self.stages))}, auto_stage={self.auto_stage.name})"
        )


class PipelinedExecution(_ExecutionStrategy):
    """Stages run as a pipeline: in training, gradient accumulation must be at least 2N-1 for N stages."""


class ShardedExecution(_ExecutionStrategy):
    """Stages run one after another, one IPU busy at a time; no constraint on gradient accumulation."""


class Phase:
    """A phase of a phased strategy: stages that run together (`Phase("A", "B")` is one stage of two blocks)."""

    def __init__(self, *arg):
        if all(isinstance(a, Stage) for a in arg):
            self.stages = list(arg)
        else:
            if not all(isinstance(a, str) for a in arg):
                raise AssertionError(
                    "All arguments must either be block IDs (strings) or Stages: "
                    + str([type(a) for a in arg])
                )
            self.stages = [Stage(*arg)]

    def stage(self, idx: int) -> Stage:
        return self.stages[idx]

    def ipus(self, *ipus: int) -> Phase:
        """One IPU for each stage of the phase."""
        if len(ipus) != len(self.stages):
            raise AssertionError(
                f"Phase contains {len(self.stages)} stages but you provided {len(ipus)} ipus"
            )
        for stage, ipu in zip(self.stages, ipus):
            stage.ipu(ipu)
        return self


class _PhasedExecution(ShardedExecution):
    """Phased strategies stream weights in and out per phase; the arithmetic is sharded execution's.

    A phase is a `Phase`, a list of `Stage`s, or a list of block ids (one stage).
    """

    def __init__(self, *phases, **kwargs):
        from optimum_ipu.poptorch._logging import no_effect

        no_effect(
            type(self).__name__, "phases run as sharded execution (same arithmetic; streaming not simulated)."
        )
        self._phases = []
        for phase in phases:
            if not isinstance(phase, Phase):
                phase = Phase(*(phase if isinstance(phase, list) else [phase]))
            self._phases.append(phase)
        super().__init__(*[s for p in self._phases for s in p.stages], **kwargs)

    def phase(self, phase: int) -> Phase:
        """The `phase`-th phase (place its stages with `.ipus(...)`)."""
        return self._phases[phase]

    def useSeparateBackwardPhase(self, use: bool = True):
        return self


class ParallelPhasedExecution(_PhasedExecution):
    def sendTensorsOffChipAfterFwd(self, off_chip: bool = True):
        return self


class SerialPhasedExecution(_PhasedExecution):
    def setTensorsLiveness(self, liveness):
        return self
