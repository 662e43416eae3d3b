"""`optimum.graphcore.models.wav2vec2.modeling_wav2vec2`: the speech pre-training example's sampler."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
