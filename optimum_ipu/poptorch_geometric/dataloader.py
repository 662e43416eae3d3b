"""PopTorch Geometric's data loaders: PyTorch Geometric batches as `poptorch.DataLoader` items.

`DataLoader` collates graphs as `torch_geometric.loader.DataLoader` does; `FixedSizeDataLoader` pads every
mini-batch to the fixed numbers of nodes, edges and graphs of a `FixedSizeOptions`, which a compiled IPU
program needs. Both are `poptorch.DataLoader`s: `batch_size` is the mini-batch, and each item is the
combined batch of one host call (device iterations x replicas x gradient accumulation mini-batches, each
tensor concatenated on dim 0), which the wrapped model splits back into its mini-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

from torch.utils.data import RandomSampler, SequentialSampler
from torch_geometric.data import HeteroData
from torch_geometric.loader.dataloader import Collater

from optimum_ipu.poptorch import DataLoader as _PoptorchDataLoader
from optimum_ipu.poptorch._logging import logger
from optimum_ipu.poptorch.options import Options
from optimum_ipu.poptorch_geometric.collate import CombinedBatchingCollater, FixedSizeCollater
from optimum_ipu.poptorch_geometric.fixed_size_options import FixedSizeOptions
from optimum_ipu.poptorch_geometric.stream_packing_sampler import StreamPackingSampler

__all__ = ["DataLoader", "FixedSizeDataLoader", "FixedSizeStrategy", "OverSizeStrategy"]


class FixedSizeStrategy(Enum):
    """How mini-batches reach their fixed size.

    - `PadToMax`: `batch_size - 1` real graphs per mini-batch, plus one padding graph.
    - `StreamPack`: consecutive graphs while they fit the fixed sizes, plus padding graphs: a varied number
      of real graphs, less room wasted on padding.
    """

    PadToMax = 0
    StreamPack = 1


class OverSizeStrategy(Enum):
    """What happens when the graphs of a mini-batch do not fit its fixed size.

    - `Error`: raise, naming the sizes to change.
    - `Skip`: leave out a graph that does not fit (with `FixedSizeStrategy.StreamPack`).
    - `TrimNodes`, `TrimEdges`, `TrimNodesAndEdges`: remove the excess nodes and/or edges (the last ones of
      the last graphs), losing that information.
    """

    Error = 0
    Skip = 1
    TrimNodes = 2
    TrimEdges = 3
    TrimNodesAndEdges = 4


class DataLoader(_PoptorchDataLoader):
    """`torch_geometric.loader.DataLoader` as a `poptorch.DataLoader`: mini-batches of `batch_size` graphs
    collated into a `Batch` (sizes vary, so combining several per host call needs equal-sized ones).

    Args:
        dataset: a PyTorch Geometric dataset or a list of `Data`/`HeteroData`.
        batch_size: graphs per mini-batch.
        shuffle: reshuffle every epoch.
        follow_batch, exclude_keys: as `torch_geometric.loader.DataLoader`.
        options: the `poptorch.Options` of the model (default: `poptorch.Options()`).
        **kwargs: further `poptorch.DataLoader` arguments.
    """

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False,
                 follow_batch: Sequence[str] | None = None, exclude_keys: Sequence[str] | None = None,
                 options: Options | None = None, **kwargs: Any):  # fmt: skip
        kwargs.pop("collate_fn", None)
        self.follow_batch = follow_batch
        self.exclude_keys = exclude_keys
        collater = CombinedBatchingCollater(Collater(dataset, follow_batch, exclude_keys), mini_batch_size=batch_size)
        super().__init__(options if options is not None else Options(), dataset, batch_size=batch_size,
                         shuffle=shuffle, collate_fn=collater, **kwargs)  # fmt: skip


class FixedSizeDataLoader(_PoptorchDataLoader):
    """Mini-batches of graphs padded to a fixed size, as `poptorch.DataLoader` items.

    Args:
        dataset: a PyTorch Geometric dataset of `Data` graphs.
        batch_size: graphs per padded mini-batch, padding graph included (so at least 2); must equal
            `fixed_size_options.num_graphs`.
        shuffle: reshuffle every epoch.
        fixed_size_options: the fixed sizes; default `FixedSizeOptions.from_dataset(dataset, batch_size)`,
            room for the largest graphs.
        fixed_size_strategy: `FixedSizeStrategy.PadToMax` (default) or `StreamPack`.
        over_size_strategy: `OverSizeStrategy.Error` (default), `Skip`, or a `Trim...` strategy.
        add_pad_masks: attach `graphs_mask`, `nodes_mask` and `edges_mask` (True for real entries).
        follow_batch, exclude_keys: as `torch_geometric.loader.DataLoader`.
        options: the `poptorch.Options` of the model (default: `poptorch.Options()`).
        **kwargs: further `poptorch.DataLoader` arguments (`drop_last` defaults to True, as PopTorch's).
    """

    def __init__(
        self,
        dataset,
        batch_size: int = 2,
        shuffle: bool = False,
        fixed_size_options: FixedSizeOptions | None = None,
        fixed_size_strategy: FixedSizeStrategy = FixedSizeStrategy.PadToMax,
        over_size_strategy: OverSizeStrategy = OverSizeStrategy.Error,
        add_pad_masks: bool = True,
        follow_batch: Sequence[str] | None = None,
        exclude_keys: Sequence[str] | None = None,
        options: Options | None = None,
        **kwargs: Any,
    ):
        if "collate_fn" in kwargs:
            raise TypeError(
                f"{type(self).__name__} collates with its own fixed-size collater; collate_fn cannot be set. "
                "For a collater of your own, use poptorch.DataLoader and pad with torch_geometric.transforms.Pad."
            )
        if fixed_size_options is None:
            fixed_size_options = FixedSizeOptions.from_dataset(dataset, batch_size)
        if isinstance(dataset[0], HeteroData) and not fixed_size_options.is_hetero():
            fixed_size_options.to_hetero(dataset[0].node_types, dataset[0].edge_types)
        if batch_size != fixed_size_options.num_graphs:
            raise ValueError(
                f"`num_graphs` in fixed size options must match provided batch size in dataloader: num_graphs is "
                f"{fixed_size_options.num_graphs} but batch_size is {batch_size}. Pass "
                "batch_size=fixed_size_options.num_graphs (the real graphs plus the padding graph)."
            )
        self.fixed_size_options = fixed_size_options
        self.padded_batch_size = batch_size
        trim_nodes = over_size_strategy in (OverSizeStrategy.TrimNodes, OverSizeStrategy.TrimNodesAndEdges)
        trim_edges = over_size_strategy in (OverSizeStrategy.TrimEdges, OverSizeStrategy.TrimNodesAndEdges)
        batch_sampler = kwargs.pop("batch_sampler", None)
        if fixed_size_strategy == FixedSizeStrategy.StreamPack:
            if batch_sampler is not None:
                raise ValueError(
                    "FixedSizeStrategy.StreamPack makes its own batches and cannot take a batch_sampler: pass "
                    "batch_sampler=None, or use FixedSizeStrategy.PadToMax with your sampler."
                )
            batch_sampler = StreamPackingSampler(
                dataset,
                batch_size - 1,  # room for real graphs: one is the padding graph's, and so are a node and an edge
                max_num_nodes=fixed_size_options.total_num_nodes - 1,
                max_num_edges=fixed_size_options.total_num_edges - 1,
                base_sampler=RandomSampler(dataset) if shuffle else SequentialSampler(dataset),
                allow_skip_data=over_size_strategy == OverSizeStrategy.Skip,
            )
        elif fixed_size_strategy != FixedSizeStrategy.PadToMax:
            raise NotImplementedError(f"Fixed size strategy {fixed_size_strategy} is not supported.")
        elif over_size_strategy == OverSizeStrategy.Skip:
            logger.warning(
                "OverSizeStrategy.Skip has no effect with FixedSizeStrategy.PadToMax: every mini-batch takes "
                "batch_size - 1 graphs, and one that does not fit raises. Use FixedSizeStrategy.StreamPack to skip "
                "graphs that do not fit, or a Trim strategy."
            )
        collater = CombinedBatchingCollater(
            FixedSizeCollater(fixed_size_options, add_masks_to_batch=add_pad_masks, trim_nodes=trim_nodes,
                              trim_edges=trim_edges, follow_batch=follow_batch, exclude_keys=exclude_keys),
            mini_batch_size=None if batch_sampler is not None else batch_size - 1,
        )  # fmt: skip
        options = options if options is not None else Options()
        if batch_sampler is not None:
            super().__init__(options, dataset, batch_sampler=batch_sampler, collate_fn=collater, **kwargs)
        else:
            super().__init__(options, dataset, batch_size=batch_size - 1, shuffle=shuffle, collate_fn=collater,
                             **kwargs)  # fmt: skip
