"""`optimum.graphcore.training_args_seq2seq`: `IPUSeq2SeqTrainingArguments` (optimum_ipu/trainer_seq2seq.py)."""

from optimum_ipu.compat._names import bind

__all__, __getattr__, __dir__ = bind(__name__)
