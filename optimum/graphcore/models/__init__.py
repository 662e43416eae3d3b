"""`optimum.graphcore.models`: the per-family modules of Optimum Graphcore 0.7 that notebooks import from."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
