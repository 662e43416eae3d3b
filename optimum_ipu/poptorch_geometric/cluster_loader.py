"""`poptorch_geometric.cluster_loader`: `FixedSizeClusterLoader` is not provided (see `_not_provided`)."""

from optimum_ipu.poptorch_geometric._not_provided import FixedSizeClusterLoader

__all__ = ["FixedSizeClusterLoader"]
