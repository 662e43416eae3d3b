"""PopTorch's compile-time checks, with messages that say what to change.

Each check is a pure function of counts so it is testable alone and reusable by the cost model's layout search.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

MAX_IPUS_PER_PROCESS = 64


class IPUCompilationError(ValueError):
    """A configuration a real IPU would refuse to compile."""


def min_gradient_accumulation(forward_stages: int) -> int:
    """The least gradient accumulation a pipeline of `forward_stages` compiles with: PopART refuses an
    accumulation below its pipeline stages counted over forward and backward (its pipeline transform),
    and autodiff numbers a backward stage 2 x (the loss's stage) - its forward stage, so the backward's
    first stage is the forward's last: 2S - 1 in all."""
    return 2 * forward_stages - 1


def check_pipelined_training(
    gradient_accumulation_steps: int, ipus_per_replica: int, forward_stages: int | None = None
) -> None:
    """GA must fill the pipeline's stages, forward and backward (`min_gradient_accumulation`):
    2S−1 for S forward stages, one per IPU and one more for a tied head (`StagePlan.forward_stages`)."""
    s = forward_stages or ipus_per_replica
    why = f"{ipus_per_replica} IPUs per replica"
    if s > ipus_per_replica:
        why += (
            f", plus {s - ipus_per_replica} for blocks back on an IPU the forward had left: a head tied to "
            "the word embedding runs on IPU 0 after the last layer"
        )
    stages = min_gradient_accumulation(s)
    if s > 1 and gradient_accumulation_steps < stages:
        raise IPUCompilationError(
            f"gradientAccumulation must be greater than or equal to the number of pipeline stages "
            f"(2S−1 = {stages} for S = {s} forward stages: {why}), got gradient_accumulation_steps="
            f"{gradient_accumulation_steps}. Raise --gradient_accumulation_steps to at least {stages} "
            f"(more amortises the pipeline fill and flush), or use fewer IPUs per replica."
        )


def ipus_to_reserve(requested: int) -> int:
    """The IPUs a process reserves for `requested`: the next power of two (the rule both front ends use;
    above `MAX_IPUS_PER_PROCESS` a process cannot attach them at all)."""
    return 1 << (requested - 1).bit_length()


def reserve_ipus(
    requested: int,
    auto_round: bool,
    too_many: Callable[[int], Exception],
    not_a_power_of_two: Callable[[int, int], Exception],
    rounding_up: Callable[[int, int], None],
) -> int:
    """The IPUs a process reserves for `requested`, by the rule of both front ends, in each one's words.

    At most `MAX_IPUS_PER_PROCESS` (else `too_many(requested)` is raised); a power of two (else
    `not_a_power_of_two(requested, reserved)` is raised, unless `auto_round`: then `rounding_up(requested,
    reserved)` says so and the extra IPUs sit idle).
    """
    if requested > MAX_IPUS_PER_PROCESS:
        raise too_many(requested)
    reserved = ipus_to_reserve(requested)
    if reserved != requested:
        if not auto_round:
            raise not_a_power_of_two(requested, reserved)
        rounding_up(requested, reserved)
    return reserved


def ipus_of_process(ipus: int, processes: int = 1) -> int:
    """The IPUs one process attaches to when `processes` processes share out a run of `ipus` IPUs (the
    replicas times the IPUs of each): an equal share, whole replicas per process or one pipeline stage of
    its pipeline's replicas (`runtime.distributed.process_layout`), as each poprun instance attaches to its
    own replicas' IPUs. The count both front ends check against a process's limit."""
    return -(-ipus // max(1, processes))


def check_num_ipus(
    ipus_per_replica: int, replication_factor: int, auto_round: bool = False, processes: int = 1
) -> int:
    """The IPUs a process attaches to (`ipus_of_process`: its share of the run's, under `processes`
    processes) must be a power of two, at most 64; return how many it gets."""
    run = f"{ipus_per_replica} IPUs per replica x {replication_factor} replicas"
    if processes > 1:
        run += f" / {processes} processes"

    def too_many(requested: int) -> IPUCompilationError:
        return IPUCompilationError(
            f"{run} = {requested} IPUs, but one process can use at most {MAX_IPUS_PER_PROCESS}. Lower "
            "replication_factor, or launch more processes (torchrun --nproc_per_node), each running its share "
            "of the replicas."
        )

    def not_a_power_of_two(requested: int, power: int) -> IPUCompilationError:
        # The power of two below, where one replica still fits in it; else only the one above.
        choices = f"{power // 2} or {power}" if power // 2 >= ipus_per_replica else f"{power}"
        return IPUCompilationError(
            f"{run} = {requested} IPUs, which is not a power of two. Use {choices} IPUs "
            f"{'per process' if processes > 1 else 'in total'} (change replication_factor or layers_per_ipu), "
            f"or let the runtime round up to {power} (auto_round_num_ipus=True; the extra IPUs sit idle)."
        )

    def rounding_up(requested: int, power: int) -> None:
        logger.warning("Rounding %d requested IPUs up to %d (the extra IPUs are idle).", requested, power)

    requested = ipus_of_process(ipus_per_replica * replication_factor, processes)
    return reserve_ipus(requested, auto_round, too_many, not_a_power_of_two, rounding_up)
