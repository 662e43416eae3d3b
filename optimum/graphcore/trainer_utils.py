"""`optimum.graphcore.trainer_utils`: `to_poptorch_dataloader`, on optimum-ipu's `poptorch.DataLoader`."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
