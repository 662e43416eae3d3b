"""`popdist.poptorch`: `Options(ipus_per_replica=None)`, a `poptorch.Options` laid out for this poprun instance.

`popdist.poptorch.Options()` is a plain `poptorch.Options` laid out for the optimum-ipu runtime's
processes (`optimum_ipu.poptorch._distributed`): the whole run's replicas, and this instance's index
among the instances, as `popdist` reads them.
"""

from __future__ import annotations

import os
from typing import Any

from optimum_ipu.poptorch.options import Options as _PoptorchOptions
from optimum_ipu.sdk import launch as contract
from optimum_ipu.sdk.popdist import (
    getInstanceIndex,
    getNumInstances,
    getNumIpusPerReplica,
    getNumTotalReplicas,
)

__all__ = ["Options"]


def Options(ipus_per_replica: int | None = None, **kwargs: Any) -> _PoptorchOptions:
    """A `poptorch.Options` laid out for this instance of a poprun launch; chain other setters on it.

    Sets `replicationFactor(getNumTotalReplicas())` (the whole run's replicas, of which this instance
    runs `getNumLocalReplicas()`) and `Distributed.configureProcessId(getInstanceIndex(),
    getNumInstances())`. `ipus_per_replica` is the model's IPUs per replica, as the program passes it;
    when poprun was given `--ipus-per-replica` too, the two must agree (on a pod, each instance's
    replicas are laid out with poprun's). Other keyword arguments go to `poptorch.Options`.
    """
    total, launched = getNumTotalReplicas(), getNumIpusPerReplica()  # checked before anything is built
    if ipus_per_replica is not None and contract.IPUS_PER_REPLICA_ENV in os.environ:
        if int(ipus_per_replica) != launched:
            raise ValueError(
                f"popdist.poptorch.Options(ipus_per_replica={ipus_per_replica}) does not match poprun's "
                f"--ipus-per-replica {launched}: each replica of the model uses {ipus_per_replica} IPUs. Launch "
                f"with poprun --ipus-per-replica {ipus_per_replica} (or leave the flag out)."
            )
    try:
        options = _PoptorchOptions(**kwargs)
    except TypeError:
        raise TypeError(
            f"popdist.poptorch.Options() got keyword arguments {sorted(kwargs)} that poptorch.Options() does not "
            "take: call the setters on the options it returns instead (e.g. .deviceIterations(4))."
        ) from None
    options.replicationFactor(total)
    options.Distributed.configureProcessId(getInstanceIndex(), getNumInstances())
    return options
