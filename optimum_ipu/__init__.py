"""optimum-ipu: run and plan Graphcore-IPU-style training with Hugging Face tools on a simulated IPU.

The public surface is deliberately small; everything else lives in private-by-convention modules.
Heavy imports (torch, transformers) happen on first use of a name, so `optimum-ipu config show`
and `import optimum_ipu` stay fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "IPUConfig": "optimum_ipu.configuration",
    "IPUTrainingArguments": "optimum_ipu.training_args",
    "IPUTrainer": "optimum_ipu.trainer",
    "IPUSeq2SeqTrainer": "optimum_ipu.trainer_seq2seq",
    "IPUSeq2SeqTrainingArguments": "optimum_ipu.trainer_seq2seq",
    "to_pipelined": "optimum_ipu.pipelining",
    "get_last_checkpoint": "optimum_ipu.checkpoints",
}

__all__ = [
    "IPUConfig",
    "IPUSeq2SeqTrainer",
    "IPUSeq2SeqTrainingArguments",
    "IPUTrainer",
    "IPUTrainingArguments",
    "get_last_checkpoint",
    "to_pipelined",
    "__version__",
]

if TYPE_CHECKING:  # pragma: no cover
    from optimum_ipu.checkpoints import get_last_checkpoint
    from optimum_ipu.configuration import IPUConfig
    from optimum_ipu.pipelining import to_pipelined
    from optimum_ipu.trainer import IPUTrainer
    from optimum_ipu.trainer_seq2seq import IPUSeq2SeqTrainer, IPUSeq2SeqTrainingArguments
    from optimum_ipu.training_args import IPUTrainingArguments


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'optimum_ipu' has no attribute {name!r}")
