"""The Poplar SDK's `popdist` import name, provided by optimum-ipu: `optimum_ipu.poptorch.sdk_popdist`'s calls.

What a PopTorch program launched by `poprun` asks about its launch (`isPopdistEnvSet`,
`getInstanceIndex`, `getNumTotalReplicas`, ...), read from the environment poprun's torchrun launch
sets; `popdist.poptorch.Options` builds the program's `poptorch.Options` for its instance.
"""

from optimum_ipu.poptorch.sdk_popdist import (  # noqa: F401 - __getattr__ names what is not provided
    __getattr__,
    execute_on_instances,
    getInstanceIndex,
    getNumInstances,
    getNumIpusPerReplica,
    getNumLocalReplicas,
    getNumTotalReplicas,
    init,
    isPopdistEnvSet,
)
from popdist import poptorch  # imported here too, so `popdist.poptorch` is there after `import popdist`

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
