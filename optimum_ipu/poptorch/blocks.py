"""Execution strategies and stages: how PopTorch groups a model's blocks onto IPUs.

`PipelinedExecution` (PopTorch's default) and `ShardedExecution` take stages or block ids; blocks
not named in a stage get one by the `AutoStage` rule (stage id = IPU id, or a new stage per block).
The phased strategies are accepted, and run as sharded execution (the same arithmetic).
"""

from __future__ import annotations

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
        """Place the stage's blocks on IPU `ipu`."""
        self._ipu = int(ipu)
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

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({', '.join(map(repr, self.stages))}, auto_stage={self.auto_stage.name})"
        )


class PipelinedExecution(_ExecutionStrategy):
    """Stages run as a pipeline: in training, gradient accumulation must be at least 2N-1 for N stages."""


class ShardedExecution(_ExecutionStrategy):
    """Stages run one after another, one IPU busy at a time; no constraint on gradient accumulation."""


class Phase:
    """A phase of a phased strategy: stages that run together."""

    def __init__(self, *stages):
        self.stages = [s if isinstance(s, Stage) else Stage(s) for s in stages]

    def ipus(self, *ipus: int) -> Phase:
        for stage, ipu in zip(self.stages, ipus):
            stage.ipu(ipu)
        return self


class _PhasedExecution(ShardedExecution):
    """Phased strategies stream weights in and out per phase; the arithmetic is sharded execution's."""

    def __init__(self, *phases, **kwargs):
        from optimum_ipu.poptorch._logging import no_effect

        no_effect(
            type(self).__name__, "phases run as sharded execution (same arithmetic; streaming not simulated)."
        )
        stages = [s for p in phases for s in (p.stages if isinstance(p, Phase) else [p])]
        super().__init__(*stages, **kwargs)

    def phase(self, phase: int) -> Phase:
        return Phase(self.stages[phase])

    def useSeparateBackwardPhase(self, use: bool = True):
        return self


class ParallelPhasedExecution(_PhasedExecution):
    def sendTensorsOffChipAfterFwd(self, off_chip: bool = True):
        return self


class SerialPhasedExecution(_PhasedExecution):
    def setTensorsLiveness(self, liveness):
        return self
