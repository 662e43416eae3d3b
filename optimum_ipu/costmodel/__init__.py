"""The cost model of the simulated IPU: hardware data, memory and speed estimates, reports, layout planning.

It estimates; it never runs a model. `optimum-ipu plan` and the trainer's compile report use it; training
does not need it.

`analyse(model, plan, ipu_config, micro_batch_size=...)` traces a model on the meta device and returns
a `CompileReport` (per-IPU memory against 900 MB, estimated throughput of a real IPU system);
`report.memory.raise_if_out_of_memory()` raises `IPUOutOfMemoryError` like Poplar would.

Names are imported on first use: the hardware models are torch-free, and `optimum-ipu plan` prices a
cached profile without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "analyse": "optimum_ipu.costmodel.analysis",
    "CompileReport": "optimum_ipu.costmodel.report",
    "IPUOutOfMemoryError": "optimum_ipu.costmodel.memory",
    "HARDWARE": "optimum_ipu.costmodel.hardware",
}
__all__ = ["HARDWARE", "CompileReport", "IPUOutOfMemoryError", "analyse"]

if TYPE_CHECKING:  # pragma: no cover
    from optimum_ipu.costmodel.analysis import analyse
    from optimum_ipu.costmodel.hardware import HARDWARE
    from optimum_ipu.costmodel.memory import IPUOutOfMemoryError
    from optimum_ipu.costmodel.report import CompileReport


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'optimum_ipu.costmodel' has no attribute {name!r}")
