"""`poptorch_geometric.neighbor_loader`: `FixedSizeNeighborLoader` is not provided (see `_not_provided`)."""

from optimum_ipu.poptorch_geometric._not_provided import FixedSizeNeighborLoader

__all__ = ["FixedSizeNeighborLoader"]
