"""`optimum.graphcore.data.data_collator`: the same names as `optimum.graphcore.data`."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
