"""`optimum.graphcore.pipelines`: `pipeline()` for question answering and image classification on the simulated IPU."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
