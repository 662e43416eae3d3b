"""`PyGArgsParser`: PyTorch Geometric's `Data`, `Batch` and `HeteroData` as PopTorch custom argument types.

Registered with `poptorch.registerCustomArgParser` when `poptorch_geometric` is imported, so a wrapped model
can take a whole `Batch` as an argument and `poptorch.DataLoader` can combine batches of them: their tensors
are found, in a fixed order (each store's keys sorted), and put back into a copy of the object.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch_geometric.data import Data, HeteroData

from optimum_ipu.poptorch.custom_args import ICustomArgParser, registerCustomArgParser

__all__ = ["PyGArgsParser", "registerCustomArgParsers"]


def _tensor_slots(data: Any) -> Iterator[tuple[Any, str]]:
    """(store, key) of each tensor in `data`, stores in PyG's order and keys sorted within a store."""
    for store in data.stores:
        for key in sorted(store.keys()):
            if isinstance(store[key], torch.Tensor):
                yield store, key


class PyGArgsParser(ICustomArgParser):
    """Finds the tensors of a PyTorch Geometric data object and builds a copy around other tensors."""

    def yieldTensors(self, struct: Any) -> Iterator[torch.Tensor]:
        for store, key in _tensor_slots(struct):
            yield store[key]

    def reconstruct(self, original_structure: Any, tensor_iterator: Iterator[torch.Tensor]) -> Any:
        out = copy.copy(original_structure)
        for store, key in list(_tensor_slots(out)):
            store[key] = next(tensor_iterator)
        return out


def registerCustomArgParsers() -> None:
    """Register `PyGArgsParser` for `Data` (so `Batch` objects too) and `HeteroData`."""
    registerCustomArgParser(Data, PyGArgsParser())
    registerCustomArgParser(HeteroData, PyGArgsParser())
