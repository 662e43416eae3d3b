"""`optimum.graphcore.data`: `pad_on_batch_axis`, and the data collators Optimum Graphcore had."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
