"""`optimum.graphcore.pipelines`: `pipeline()` and the IPU pipeline classes, on the simulated IPU (`list_tasks()`)."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
