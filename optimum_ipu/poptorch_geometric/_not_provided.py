"""The sampling loaders PopTorch Geometric had and optimum-ipu does not provide, with the reason.

PopTorch Geometric's `FixedSizeNeighborLoader` and `FixedSizeClusterLoader` pad the subgraphs that
PyTorch Geometric's `NeighborLoader` and `ClusterData`/`ClusterLoader` sample. Those samplers (neighbour
sampling, METIS partitioning) run only with PyTorch Geometric's compiled extensions pyg-lib or torch-sparse,
which publish no wheel for this torch on the package index, so neither the samplers nor a fixed-size
version of them could be built and checked here. The classes exist so that a program importing them is told
so where it creates one, rather than failing on a missing module.
"""

from __future__ import annotations

from typing import Any, NoReturn

_REASON = (
    "{name} is not provided by optimum-ipu's poptorch_geometric: it pads the subgraphs of PyTorch Geometric's "
    "{sampler}, which needs the compiled extensions pyg-lib or torch-sparse (no wheel for this torch), so it "
    "could not be built and checked here. Train full-batch on the whole graph (poptorch_geometric.dataloader."
    "DataLoader(dataset, batch_size=1), as PopTorch Geometric's 'a worked example' does), or batch small graphs "
    "with poptorch_geometric.FixedSizeDataLoader."
)


def refuse(name: str, sampler: str) -> NoReturn:
    """Raise the error for a loader that is not provided."""
    raise NotImplementedError(_REASON.format(name=name, sampler=sampler))


class FixedSizeNeighborLoader:
    """Not provided: see this module's docstring. Creating one raises `NotImplementedError` with the reason."""

    def __init__(self, *args: Any, **kwargs: Any):
        refuse(type(self).__name__, "NeighborLoader (neighbour sampling)")


class FixedSizeClusterLoader:
    """Not provided: see this module's docstring. Creating one raises `NotImplementedError` with the reason."""

    def __init__(self, *args: Any, **kwargs: Any):
        refuse(type(self).__name__, "ClusterData/ClusterLoader (METIS partitioning)")
