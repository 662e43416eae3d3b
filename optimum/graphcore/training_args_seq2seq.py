"""`optimum.graphcore.training_args_seq2seq`: no equivalent here; using its name says what to use instead."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
