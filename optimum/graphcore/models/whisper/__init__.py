"""`optimum.graphcore.models.whisper`: the torch feature extractor and processor (transformers' own here)."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
