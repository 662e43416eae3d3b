"""`popdist`: what a PopTorch program launched by `poprun` asks about its launch.

On an IPU-POD, `poprun --num-instances N --num-replicas R program` starts N instances (host
processes) of the program, each running R / N of the replicas, and PopDist tells each instance who
it is. Here `poprun` (`optimum_ipu.sdk.poprun`) starts the N instances with torchrun, so the
instance index and count are torchrun's `RANK` and `WORLD_SIZE`; poprun adds the two numbers
torchrun has no word for, in `POPDIST_NUM_TOTAL_REPLICAS` and `POPDIST_NUM_IPUS_PER_REPLICA` (the
launch contract, `optimum_ipu.sdk.launch`, judges them). Outside poprun `isPopdistEnvSet()` is False
and the counts describe one instance with one replica (under a plain torchrun: one replica per
process).

`popdist.poptorch.Options()` is a plain `poptorch.Options` laid out for the optimum-ipu runtime's
processes (`_distributed`): `replicationFactor` is the *whole run's* replica count R and
`opts.Distributed` names this instance among N, so each instance runs replicas k*R/N ... (k+1)*R/N - 1
on its share of every combined batch, the gradient sums are all-reduced over the instances, and the
run equals the one-process run with R replicas. (PopTorch on a pod sets the instance's R / N there;
its DataLoader and all-reduce then do the same split. A program that reads `opts.replication_factor`
sees R here; `popdist.getNumLocalReplicas()` is R / N in both.)

`popdist.poptorch` is the submodule `poptorch` of this package. The top-level `popdist` is this
package under the SDK's name (the same module objects).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from optimum_ipu.poptorch import _distributed
from optimum_ipu.sdk import launch as contract

__all__ = [
    "execute_on_instances",
    "getInstanceIndex",
    "getNumInstances",
    "getNumIpusPerReplica",
    "getNumLocalReplicas",
    "getNumTotalReplicas",
    "init",
    "isPopdistEnvSet",
    "poptorch",
]

def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"{name}={value!r} is not an integer: launch the program with poprun, which sets it."
        ) from None


def isPopdistEnvSet() -> bool:
    """True in an instance launched by `poprun`; False otherwise (a plain `python` or `torchrun` launch)."""
    return contract.launched_by_poprun(os.environ)


def getInstanceIndex() -> int:
    """This instance's index, 0 ... N-1 (torchrun's `RANK`; 0 outside a launch)."""
    return _env_int(contract.INSTANCE_ENV, 0)


def getNumInstances() -> int:
    """How many instances the launch runs (torchrun's `WORLD_SIZE`; 1 outside a launch)."""
    return _env_int(contract.INSTANCES_ENV, 1)


def _hand_set(name: str, value: int, why: str) -> ValueError:
    return ValueError(
        f"{name}={value} cannot be: {why}. poprun sets it for the instances it launches; launch the program "
        "with poprun (--num-instances, --num-replicas, --ipus-per-replica) rather than setting it by hand."
    )


def getNumTotalReplicas() -> int:
    """The replicas of the whole run (`poprun --num-replicas`; one per instance outside poprun).

    Raises `ValueError` for a value no launch can have (set by hand): fewer replicas than one per
    instance, or a number the instances cannot share equally.
    """
    instances = getNumInstances()
    total = _env_int(contract.TOTAL_REPLICAS_ENV, instances)
    problem = contract.replicas_problem(total, instances)
    if problem and total >= 1:
        problem += f" ({' or '.join(map(str, contract.replica_counts(total, instances)))})"
    if problem:
        raise _hand_set(contract.TOTAL_REPLICAS_ENV, total, problem)
    return total


def getNumLocalReplicas() -> int:
    """The replicas this instance runs: total replicas / instances (poprun checks that it divides)."""
    return getNumTotalReplicas() // getNumInstances()


def getNumIpusPerReplica() -> int:
    """The IPUs each replica uses (`poprun --ipus-per-replica`; 1 when not given)."""
    ipus = _env_int(contract.IPUS_PER_REPLICA_ENV, 1)
    problem = contract.ipus_problem(ipus)
    if problem:
        raise _hand_set(contract.IPUS_PER_REPLICA_ENV, ipus, problem)
    return ipus


def init() -> None:
    """Join the instances' process group (torch.distributed, the one PopTorch's models use); idempotent.

    On a pod, PopDist's `init()` sets up the instances' communication; here that is torchrun's process
    group, which `poptorch.trainingModel` and `horovod.torch` then share. Alone, it does nothing.
    """
    if getNumInstances() > 1:
        _distributed.join_process_group()


def execute_on_instances(instances: set[int], fn: Callable[..., Any], *args: Any) -> Any:
    """Run `fn(*args)` on the instances in `instances` only, then wait for every instance (a barrier).

    The usual use: save a checkpoint on instance 0 while the others wait for it. Returns `fn`'s result
    on the instances that ran it, None on the others.
    """
    result = fn(*args) if getInstanceIndex() in set(instances) else None
    if getNumInstances() > 1:
        _distributed.join_process_group()
        dist.barrier()
    return result


def __getattr__(name: str):
    """Any other PopDist name: an `AttributeError` naming what this stand-in provides."""
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"popdist.{name} is not provided by optimum-ipu's popdist, which has "
        f"{', '.join(n for n in __all__ if n != 'poptorch')} and popdist.poptorch.Options (the PopTorch calls "
        "of Graphcore's applications)."
    )


from optimum_ipu.sdk.popdist import poptorch  # noqa: E402 - the submodule needs the calls above
