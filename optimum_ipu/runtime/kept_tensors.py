"""Weight-sized scratch tensors kept from one update to the next.

An update's fp32 copies and fp16 sums are as large as the weights. Allocating them afresh at every
update costs more than filling them (the allocator hands out fresh pages, each one a page fault), so
the accumulator (`gradients.py`) and the optimizers' working copies (`optimizers.py`) keep theirs in a
dict and fill them in place.
"""

from __future__ import annotations

from collections.abc import Hashable, MutableMapping

import torch


def kept_tensor(
    store: MutableMapping[Hashable, torch.Tensor], key: Hashable, shape: torch.Size, dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """`store[key]`, an uninitialised tensor of `shape`, `dtype` and `device`: made on first use, and made
    again when what is asked changes (a weight resized or moved); its values are the caller's to write."""
    tensor = store.get(key)
    if tensor is None or tensor.shape != shape or tensor.dtype != dtype or tensor.device != device:
        tensor = store[key] = torch.empty(shape, dtype=dtype, device=device)
    return tensor
