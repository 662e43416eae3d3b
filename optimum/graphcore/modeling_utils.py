"""`optimum.graphcore.modeling_utils`: `to_pipelined` and placement helpers, on optimum-ipu's pipelining."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
