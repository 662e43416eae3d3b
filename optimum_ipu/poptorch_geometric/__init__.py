"""PopTorch Geometric (`poptorch_geometric`) for optimum-ipu: PyTorch Geometric programs written for the IPU.

Fixed-size mini-batches of graphs (`FixedSizeDataLoader`, `FixedSizeOptions`, `FixedSizeStrategy`,
`OverSizeStrategy`, the collaters in `poptorch_geometric.collate`) and PyTorch Geometric batches as
`poptorch.DataLoader` items (`poptorch_geometric.dataloader.DataLoader`, not exported here, as in PopTorch
Geometric), on today's torch-geometric.
Importing it registers PyTorch Geometric's `Data`/`Batch`/`HeteroData` as PopTorch custom argument types.
What PopTorch Geometric had and this does not (the cluster and neighbour loaders, its IPU op
substitutions) is listed in docs/poptorch.md, "PyTorch Geometric".
"""

from optimum_ipu.poptorch_geometric import cluster_loader, neighbor_loader  # noqa: F401 - aliased too
from optimum_ipu.poptorch_geometric.collate import (
    CombinedBatchingCollater,
    FixedSizeCollater,
    make_exclude_keys,
)
from optimum_ipu.poptorch_geometric.dataloader import FixedSizeDataLoader, FixedSizeStrategy, OverSizeStrategy
from optimum_ipu.poptorch_geometric.fixed_size_options import FixedSizeOptions
from optimum_ipu.poptorch_geometric.types import PyGArgsParser, registerCustomArgParsers

__version__ = "3.4.0+optimum-ipu"

__all__ = [
    "__version__",
    "CombinedBatchingCollater",
    "FixedSizeCollater",
    "FixedSizeDataLoader",
    "FixedSizeOptions",
    "FixedSizeStrategy",
    "OverSizeStrategy",
    "PyGArgsParser",
    "make_exclude_keys",
]

registerCustomArgParsers()
