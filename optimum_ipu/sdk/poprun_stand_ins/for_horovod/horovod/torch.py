"""`horovod.torch` in poprun's instances: `optimum_ipu.sdk.horovod_torch`, under Horovod's name."""

import sys

import optimum_ipu.sdk.horovod_torch as _horovod_torch

sys.modules[__name__] = _horovod_torch
