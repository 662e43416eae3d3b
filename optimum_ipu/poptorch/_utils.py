"""PopTorch's `poptorch._utils` helpers that companion packages import (PopTorch Geometric among them).

`combine_batch_tensors_gen` is the one rule for putting consecutive batches into one combined batch (each
tensor concatenated on dim 0): `poptorch.DataLoader` combines a batch sampler's batches with it, and PopTorch
Geometric's `CombinedBatchingCollater` its padded mini-batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

__all__ = ["combine_batch_tensors_gen"]


def combine_batch_tensors_gen(tensors: Sequence[Sequence[torch.Tensor]]) -> Iterator[torch.Tensor]:
    """Yield, for each position in the batches' tensor lists, those tensors concatenated on dim 0.

    Args:
        tensors: one list of tensors per batch, all in the same order (as a custom argument parser or
            `flatten_custom` yields them).
    """
    for column in zip(*tensors):
        yield torch.cat(column)
