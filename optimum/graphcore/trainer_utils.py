"""`optimum.graphcore.trainer_utils`: PopTorch data loaders have no equivalent; using the name says why."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
