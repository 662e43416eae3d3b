"""`horovod.torch` in poprun's instances: `optimum_ipu.launcher.horovod_torch`, under Horovod's name."""

import sys

import optimum_ipu.launcher.horovod_torch as _horovod_torch

sys.modules[__name__] = _horovod_torch
