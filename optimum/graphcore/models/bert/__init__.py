"""`optimum.graphcore.models.bert`: `BertPipelineMixin`, the mixin of a user's own pipelined BERT."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
