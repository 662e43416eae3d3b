"""`popdist.poptorch`: `Options(ipus_per_replica=None)`, a `poptorch.Options` laid out for this poprun instance.

See `optimum_ipu.poptorch.sdk_popdist.Options`: the whole run's replicas and this instance's index among
the instances, as optimum-ipu's multi-process runtime reads them.
"""

from optimum_ipu.poptorch.sdk_popdist import Options

__all__ = ["Options"]
