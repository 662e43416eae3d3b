"""Generation as the IPU runs it: static shapes, a fixed-size KV cache.

On an IPU every tensor has a shape fixed at compile time, so Optimum Graphcore's generation ran the
encoder once and then the decoder once per token with a key/value cache allocated for the maximum
length up front (`use_cache=True` in its `parallelize()`), the new token written in place each step.
`static_generation(model)` makes transformers' own `generate()` do the same: a `StaticCache` of the
maximum length (transformers' `cache_implementation="static"`), so every decoder call after the
first sees the same shapes. The decoding (greedy, beam search, the generation config's processors) is
transformers', so the tokens are `generate()`'s. One difference remains: the loop stops once every
sequence has ended, where the IPU ran its fixed number of steps and padded; the padded tokens are the
same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from optimum_ipu.overrides import overridden

__all__ = ["static_generation"]


@contextlib.contextmanager
def static_generation(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, `model.generate()` keeps its KV cache in fixed-size buffers (static shapes).

    Args:
        model: a transformers model with a `generation_config` (placed or not).

    Raises:
        ValueError: the model has no generation config to set.
    """
    config = getattr(model, "generation_config", None)
    if config is None:
        raise ValueError(
            f"{type(model).__name__} has no generation_config: static generation is for transformers models "
            "that generate (BART, T5, MT5, Whisper, GPT-2, ...)."
        )
    with overridden(config, cache_implementation="static"):
        yield model
