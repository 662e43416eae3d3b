"""`optimum.graphcore.trainer`: `IPUTrainer`, from optimum-ipu."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
