"""`optimum.graphcore.diffusers`: the Stable Diffusion pipelines, their models placed on (simulated) IPUs."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
