"""The launch contract: what `poprun` tells the instances it launches, and the rules a launch keeps.

poprun starts the instances with torchrun, which gives each its place in the launch; poprun adds the
two numbers torchrun has no word for. `popdist` (what a PopTorch program asks about its launch) and
`horovod.torch` (its host-side collectives) read them back. The names below are the only place
either side spells them, and the rules are the only place a launch's numbers are judged: poprun
checks its command line with them, popdist the values it reads (which a user may have set by hand).

This module imports nothing of optimum-ipu or torch: poprun reads its command line, and says what is
wrong with it, before torch is imported.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "INSTANCES_ENV",
    "INSTANCE_ENV",
    "IPUS_PER_REPLICA_ENV",
    "LOCAL_INSTANCES_ENV",
    "LOCAL_INSTANCE_ENV",
    "TOTAL_REPLICAS_ENV",
    "environment",
    "instance_counts",
    "ipus_problem",
    "launched_by_poprun",
    "replica_counts",
    "replicas_problem",
]

# Set by torchrun for every instance (process) it starts.
INSTANCE_ENV = "RANK"  # this instance's index, 0 ... N-1
INSTANCES_ENV = "WORLD_SIZE"  # the instances of the launch, N
LOCAL_INSTANCE_ENV = "LOCAL_RANK"  # this instance's index on this machine (every instance runs on this one)
LOCAL_INSTANCES_ENV = "LOCAL_WORLD_SIZE"  # the instances on this machine

# Set by poprun beyond torchrun's; their presence is what tells popdist it runs under poprun.
TOTAL_REPLICAS_ENV = "POPDIST_NUM_TOTAL_REPLICAS"  # the whole run's replicas, R (--num-replicas)
IPUS_PER_REPLICA_ENV = "POPDIST_NUM_IPUS_PER_REPLICA"  # IPUs per replica (--ipus-per-replica), when given


def replicas_problem(replicas: int, instances: int) -> str | None:
    """Why `instances` instances cannot run `replicas` replicas, or None when they can.

    The rule: every instance runs the same number of replicas, replicas / instances, at least one.
    """
    if replicas < 1:
        return "a launch runs at least one replica per instance"
    if replicas % instances:
        return (
            f"the {instances} instances each run the same number of replicas (replicas / instances), so the "
            f"replicas must be a multiple of {instances}"
        )
    return None


def replica_counts(replicas: int, instances: int) -> list[int]:
    """The replica counts `instances` instances can run nearest to `replicas` (the multiples around it)."""
    below = instances * max(1, replicas // instances)
    return list(dict.fromkeys([below, instances * (replicas // instances + 1)] if replicas % instances else [below]))


def instance_counts(replicas: int) -> list[int]:
    """The instance counts that can run `replicas` replicas (its divisors)."""
    return [d for d in range(1, replicas + 1) if replicas % d == 0]


def ipus_problem(ipus_per_replica: int) -> str | None:
    """Why a replica cannot use `ipus_per_replica` IPUs, or None when it can."""
    return "a replica uses at least one IPU" if ipus_per_replica < 1 else None


def environment(replicas: int, ipus_per_replica: int | None) -> dict[str, str]:
    """The variables poprun gives the instances on top of torchrun's, for a launch it has checked."""
    env = {TOTAL_REPLICAS_ENV: str(replicas)}
    if ipus_per_replica is not None:
        env[IPUS_PER_REPLICA_ENV] = str(ipus_per_replica)
    return env


def launched_by_poprun(environ: Mapping[str, str]) -> bool:
    """Whether `environ` is that of an instance poprun launched (not a plain python or torchrun one)."""
    return TOTAL_REPLICAS_ENV in environ
