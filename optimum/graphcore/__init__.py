"""Optimum Graphcore's `optimum.graphcore`, running on optimum-ipu's simulated IPU.

Every public name of Optimum Graphcore 0.7 is here: the ones optimum-ipu provides are its objects
(`IPUConfig`, `IPUTrainer`, `IPUTrainingArguments`, `pipeline`, ...); the others import but raise
`optimum_ipu.compat.NoEquivalentError` on use, naming what to use instead. The table is
`optimum_ipu/compat/_tables.py`."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
