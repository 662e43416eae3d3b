"""Optimum Graphcore compatibility: what `optimum.graphcore` (the package's alias namespace) is made of.

Existing Optimum Graphcore code imports `from optimum.graphcore import IPUConfig, IPUTrainer, ...`.
The `optimum/graphcore/` modules shipped with optimum-ipu are thin: each binds its names from
`_tables.TABLES`, which maps every public name of Optimum Graphcore 0.7 either to optimum-ipu's
object or to a placeholder that raises `NoEquivalentError` naming the replacement. The pieces with
behaviour of their own live here: the `to_pipelined` view and `Pipelined*` adapters (`modeling`), the
IPU inference pipelines (`pipelines`, `question_answering`), `pad_on_batch_axis` (`data`) and the
version check (`versions`).
"""

from optimum_ipu.compat._names import NoEquivalentError

__all__ = ["NoEquivalentError"]
