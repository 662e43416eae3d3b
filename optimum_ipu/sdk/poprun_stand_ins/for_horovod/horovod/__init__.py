"""optimum-ipu's stand-in for Horovod, served by `poprun` to the instances it launches: `horovod.torch` only.

This folder is put on the instances' `PYTHONPATH` only when no real Horovod is installed (a real one
is never shadowed); nothing imports it otherwise. The calls are `optimum_ipu.sdk.horovod_torch`'s.
"""

__version__ = "0.0.0+optimum_ipu"
