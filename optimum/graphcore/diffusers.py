"""`optimum.graphcore.diffusers`: Stable Diffusion on IPUs has no equivalent; using a name says what to use instead."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
