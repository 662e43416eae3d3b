"""`optimum.graphcore.models.bert.modeling_bert`: `BertPipelineMixin` (the packed-BERT notebooks subclass it)."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
