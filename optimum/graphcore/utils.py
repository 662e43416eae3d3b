"""`optimum.graphcore.utils`: `check_min_version` against the Optimum Graphcore API version provided (0.7.1)."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
