"""PopTorch's compile checks on where a traced model runs, and how processes share it under torchrun.

From the blocks the trace entered (`_trace.Trace`) and the options: how many IPUs a replica uses and
how many pipeline stages it has (by the execution strategy's stage rules), the IPU count (at most 64
per process, reserved in powers of two), the minimum gradient accumulation of a pipelined training
model (2S - 1) or device iterations of a pipelined inference model (S), and which checkpointed modules
are recomputed in backward. The rules are the runtime's (`runtime.checks`, `runtime.distributed`),
the wording PopART's. Decided before any collective, so every process raises alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from optimum_ipu.poptorch import _distributed, _stages
from optimum_ipu.poptorch._logging import Error, logger
from optimum_ipu.poptorch._trace import Trace, training_flags_kept
from optimum_ipu.poptorch.blocks import PipelinedExecution, ShardedExecution
from optimum_ipu.poptorch.enums import AutoStage
from optimum_ipu.runtime.checks import ipus_of_process, min_gradient_accumulation, reserve_ipus
from optimum_ipu.runtime.distributed import process_layout

__all__ = ["Placement", "check_placement", "plan_stage_processes"]


@dataclass(frozen=True)
class Placement:
    """Where a replica runs: `num_ipus` IPUs, `num_stages` stages (pipelined or sharded), and the modules
    recomputed in backward."""

    num_ipus: int
    num_stages: int
    pipelined: bool
    recomputed: list[nn.Module]


def _recomputation_on(options, training: bool, pipelined_stages: int) -> bool:
    """PopTorch recomputes in pipelined training over 2+ stages, or when `autoRecomputation` is set."""
    auto = options._Popart._values.get("autoRecomputation")
    return training and (pipelined_stages >= 2 or bool(auto))


_RESERVED = ", because PopTorch must reserve a power of 2 or maximum of 64 IPUs per process"


def _too_many_ipus(total: int) -> Error:
    return Error(
        f"Too many IPUs requested ({total}). Experiments that need more than 64 IPUs require distributed execution."
    )


def _not_a_power_of_two(total: int, rounded: int) -> Error:
    return Error(
        f"The model specifies the use of {total} IPUs, however PopTorch must reserve a minimum of {rounded} "
        f"in order to allow the model to run{_RESERVED}. Please reconfigure your model to use a different "
        "number of IPUs or set poptorch.Options().autoRoundNumIPUs(True)."
    )


def _rounding_up(total: int, rounded: int) -> None:
    logger.warning("Reserving %d IPUs when the model specifices the use of only %d%s. %d will be reserved but "
                   "not used.", rounded, total, _RESERVED, rounded - total)  # fmt: skip


def check_placement(model: nn.Module, trace: Trace, options, training: bool) -> Placement:
    """PopTorch's compile checks on the blocks' IPUs (PopART's wording); the placement they pass."""
    ipus = trace.ipus
    strategy = options.execution_strategy
    merged = [ipu for i, ipu in enumerate(ipus) if i == 0 or ipu != ipus[i - 1]]
    stage_ipus = [s._ipu for s in strategy.stages if s._ipu is not None]
    used = max(ipus + stage_ipus) + 1
    if strategy.stages:
        stages = len(strategy.stages)
    elif strategy.auto_stage == AutoStage.AutoIncrement:
        stages = len(merged)
    else:
        stages = len(set(merged))
    # This process's share of the run's IPUs (the runtime's rule), in PopTorch's words.
    requested = ipus_of_process(used * options.replication_factor, _distributed.ipu_processes(options, training))
    reserve_ipus(requested, options.auto_round_num_ipus, _too_many_ipus, _not_a_power_of_two, _rounding_up)
    pipelined = isinstance(strategy, PipelinedExecution) and not isinstance(strategy, ShardedExecution)
    recomputed = (
        trace.checkpointed if _recomputation_on(options, training, stages if pipelined else 0) else []
    )
    if recomputed:
        names = {m: name for name, m in model.named_modules()}
        logger.info("Recomputed in backward: %s", ", ".join(names.get(m, "?") for m in recomputed))
    placement = Placement(used, stages, pipelined, recomputed)
    if not pipelined or stages < 2:
        return placement
    if training:
        pipeline = min_gradient_accumulation(stages)  # the rule IPUTrainer's check uses, in PopTorch's words
        if options.Training.gradient_accumulation < pipeline:
            raise Error(
                "poptorch.Options().Training.gradientAccumulation must be greater than or equal to the number of "
                f"pipeline stages ({pipeline}) when using poptorch.PipelinedExecution. Please note that a model "
                f"with {stages} pipeline stages in PopTorch will have an additional {stages - 1} stages when training."
            )
    elif options.device_iterations < stages:
        raise Error(
            "poptorch.Options().deviceIterations must be greater than or equal to the number of pipeline stages "
            f"({stages}) when using PopTorch.PipelinedExecution."
        )
    return placement


def plan_stage_processes(
    model: nn.Module, trace: Trace, options, training: bool, placement: Placement
) -> _stages.TracedStages | None:
    """Under torchrun, the stages each process runs when the processes do not split the replicas; None
    when they do (replica processes), or for an inference model, which then runs whole in every process.

    The runtime's layout rule (`runtime.distributed.process_layout`: whole replicas first) decides; a
    launch it refuses is PopTorch's layout error. A pipelined training model of N stages then runs as
    P / N pipelines of N stage processes (`_stages`).
    """
    count, replicas = _distributed.run_processes(options), options.replication_factor
    stages = placement.num_stages if placement.pipelined else 1
    try:
        layout = process_layout(count, replicas, stages if training else 1)
    except ValueError:
        if not training:  # inference: every process runs the whole model on the whole batch
            return None
        raise _distributed.layout_error(replicas, count, stages) from None
    if layout.stages == 1:
        return None
    # in the modes its user left it in (PopTorch calls neither train() nor eval()), as the calls run it
    with training_flags_kept(model), torch.no_grad(), torch.random.fork_rng(devices=[]):
        return _stages.plan_stages(model, trace.args, trace.kwargs, options.execution_strategy, layout.stages)
