"""Collaters: graphs into one fixed-size mini-batch, and mini-batches into one combined batch.

`FixedSizeCollater` batches graphs as PyTorch Geometric does (`Batch.from_data_list`) after appending
padding graphs, so every mini-batch has exactly `num_graphs` graphs, `num_nodes` nodes and `num_edges`
edges. The real graphs come first and keep their nodes, edges and attributes unchanged; the first padding
graph takes all the padding nodes and edges (its edges join its first node to itself, so a message passed
along them stays inside the padding graph), any further padding graphs are empty. `graphs_mask`,
`nodes_mask` and `edges_mask` say which entries are real.

`CombinedBatchingCollater` cuts a combined batch's samples into mini-batches, collates each, and
concatenates them on dim 0 (`poptorch._utils.combine_batch_tensors_gen`), the layout `poptorch.DataLoader`
gives a host call of several micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch_geometric.data import Batch, Data, HeteroData
from torch_geometric.data.data import BaseData

from optimum_ipu.poptorch._utils import combine_batch_tensors_gen
from optimum_ipu.poptorch.custom_args import flatten_custom, rebuild_custom
from optimum_ipu.poptorch_geometric.fixed_size_options import FixedSizeOptions

__all__ = ["CombinedBatchingCollater", "FixedSizeCollater", "make_exclude_keys"]

# Attribute names whose level PyTorch Geometric's own conventions fix, whatever their shapes.
_NODE_KEYS = {"x", "pos", "z", "norm", "train_mask", "val_mask", "test_mask", "n_id"}
_EDGE_KEYS = {"edge_attr", "edge_weight", "edge_type", "e_id"}


def make_exclude_keys(include_keys: Sequence[str], data: BaseData) -> tuple[str, ...]:
    """The keys of `data` not in `include_keys`: pass as `exclude_keys` to keep only `include_keys`."""
    return tuple(set(data.keys()) - set(include_keys))


def _level(key: str, data_list: list[Data]) -> str:
    """'node', 'edge' or 'graph': what one row of attribute `key` (along its concatenation dim) belongs to."""
    if key == "edge_index" or key in _EDGE_KEYS:
        return "edge"
    if key in _NODE_KEYS:
        return "node"
    values = [(d, d[key]) for d in data_list if isinstance(d[key], torch.Tensor)]
    if not values:
        return "graph"

    def rows(d: Data, v: torch.Tensor) -> int:
        dim = d.__cat_dim__(key, v)
        return v.dim() and v.size(dim)

    if all(rows(d, v) == d.num_nodes for d, v in values) and not all(rows(d, v) == 1 for d, v in values):
        return "node"
    if all(rows(d, v) == d.num_edges for d, v in values) and not all(rows(d, v) == 1 for d, v in values):
        return "edge"
    return "graph"


class FixedSizeCollater:
    """Collate a list of graphs into one PyTorch Geometric `Batch` padded to a fixed size.

    Args:
        fixed_size_options: the fixed numbers of nodes, edges and graphs and the fill values.
        add_masks_to_batch: attach `graphs_mask`, `nodes_mask` and `edges_mask` (True for real entries).
        trim_nodes: when the graphs hold too many nodes, drop the last nodes of the last graphs (and their
            edges) until one node is left for padding, instead of raising. Information is lost.
        trim_edges: when they hold too many edges, drop the last edges of the last graphs.
        follow_batch, exclude_keys: as `torch_geometric.data.Batch.from_data_list`.
    """

    def __init__(
        self,
        fixed_size_options: FixedSizeOptions,
        add_masks_to_batch: bool = False,
        trim_nodes: bool = False,
        trim_edges: bool = False,
        follow_batch: Sequence[str] | None = None,
        exclude_keys: Sequence[str] | None = None,
    ):
        self.opts = fixed_size_options
        self.add_masks_to_batch = add_masks_to_batch
        self.trim_nodes = trim_nodes
        self.trim_edges = trim_edges
        self.follow_batch = follow_batch
        self.exclude_keys = exclude_keys

    def __call__(self, data_list: list[BaseData]) -> Batch:
        if not isinstance(data_list, (list, tuple)) or not data_list:
            raise TypeError(f"FixedSizeCollater expects a non-empty list of graphs, got {data_list!r}.")
        data_list = list(data_list)
        if isinstance(data_list[0], HeteroData):
            raise NotImplementedError(
                "Fixed-size batches of HeteroData are not provided by optimum-ipu's poptorch_geometric: no program "
                "it runs needs them (PyTorch Geometric's heterogeneous samplers need pyg-lib or torch-sparse, which "
                "have no wheel for this torch). Batch homogeneous Data, or use torch_geometric's loaders."
            )
        opts = self.opts
        if len(data_list) > opts.num_graphs - 1:
            raise RuntimeError(
                f"A fixed-size batch of {opts.num_graphs} graphs holds at most {opts.num_graphs - 1} real graphs "
                f"(one is reserved for padding), got {len(data_list)}. Use num_graphs = batch_size = real graphs + 1."
            )
        if self.trim_nodes:
            data_list = self._trimmed_nodes(data_list, opts.num_nodes - 1)
        if self.trim_edges:
            data_list = self._trimmed_edges(data_list, opts.num_edges)
        real_nodes = sum(d.num_nodes for d in data_list)
        real_edges = sum(d.num_edges for d in data_list)
        for what, real, room, trim in (
            ("nodes", real_nodes, opts.num_nodes, "TrimNodes"),
            ("edges", real_edges, opts.num_edges, "TrimEdges"),
        ):
            if real > room:
                raise RuntimeError(
                    f"The fixed sizes don't leave room for the {real} {what} of {len(data_list)} graph(s): "
                    f"num_{what} is {room}. Increase num_{what} (FixedSizeOptions.from_dataset sizes it for the "
                    f"largest graphs), use fewer graphs per batch, or over_size_strategy=OverSizeStrategy.{trim} "
                    f"(or Skip with FixedSizeStrategy.StreamPack)."
                )
        pad_nodes, pad_edges = opts.num_nodes - real_nodes, opts.num_edges - real_edges
        if pad_nodes == 0 and pad_edges > 0:
            raise RuntimeError(
                f"The graphs fill all {opts.num_nodes} nodes, leaving no padding node for the {pad_edges} padding "
                "edges to join. Reserve one node for padding: num_nodes = largest real nodes + 1."
            )
        template = data_list[0]
        levels = {key: _level(key, data_list) for key in template.keys() if key not in (self.exclude_keys or ())}
        padding = [self._padding_graph(template, levels, pad_nodes, pad_edges)]
        padding += [self._padding_graph(template, levels, 0, 0) for _ in range(opts.num_graphs - len(data_list) - 1)]
        batch = Batch.from_data_list(data_list + padding, self.follow_batch, self.exclude_keys)
        if self.add_masks_to_batch:
            batch.graphs_mask = torch.arange(opts.num_graphs) < len(data_list)
            batch.nodes_mask = torch.arange(opts.num_nodes) < real_nodes
            batch.edges_mask = torch.arange(opts.num_edges) < real_edges
        return batch

    def _padding_graph(self, template: Data, levels: dict[str, str], nodes: int, edges: int) -> Data:
        """A graph like `template` with `nodes` nodes and `edges` self-loops on its first node, filled with
        the pad values."""
        opts = self.opts
        pad = Data()
        for key, level in levels.items():
            value = template[key]
            if not isinstance(value, torch.Tensor):
                default = opts.pad_graph_defaults.get(key)
                if default is None:
                    try:
                        default = type(value)()
                    except TypeError:
                        default = None
                pad[key] = default
                continue
            if key == "edge_index":
                pad[key] = torch.zeros(2, edges, dtype=value.dtype)
                continue
            if level == "graph":
                pad[key] = torch.full_like(value, opts.graph_pad_value)
                continue
            rows, fill = (nodes, opts.node_pad_value) if level == "node" else (edges, opts.edge_pad_value)
            dim = template.__cat_dim__(key, value)
            dim = dim + value.dim() if dim < 0 else dim
            shape = list(value.shape)
            shape[dim] = rows
            pad[key] = torch.full(shape, fill, dtype=value.dtype)
        pad.num_nodes = nodes
        return pad

    @staticmethod
    def _trimmed_nodes(data_list: list[Data], most: int) -> list[Data]:
        """The graphs with their last nodes removed, last graph first, until they hold at most `most` nodes;
        every graph keeps at least one node."""
        excess = sum(d.num_nodes for d in data_list) - most
        if excess <= 0:
            return data_list
        if most < len(data_list):
            raise RuntimeError(
                f"Trimming to {most + 1} nodes (one for padding) would leave some of the {len(data_list)} graphs "
                "without a node. Increase num_nodes."
            )
        out = list(data_list)
        for i in reversed(range(len(out))):
            cut = min(excess, out[i].num_nodes - 1)
            if cut:
                out[i] = out[i].subgraph(torch.arange(out[i].num_nodes - cut))
                excess -= cut
            if not excess:
                break
        return out

    @staticmethod
    def _trimmed_edges(data_list: list[Data], most: int) -> list[Data]:
        """The graphs with their last edges removed, last graph first, until they hold at most `most` edges."""
        excess = sum(d.num_edges for d in data_list) - most
        out = list(data_list)
        for i in reversed(range(len(out))):
            if excess <= 0:
                break
            cut = min(excess, out[i].num_edges)
            if cut:
                out[i] = out[i].edge_subgraph(torch.arange(out[i].num_edges - cut))
                excess -= cut
        return out


class CombinedBatchingCollater:
    """Collate a combined batch: `mini_batch_size` samples at a time with `collater`, the mini-batches
    concatenated on dim 0 (each tensor of a `Batch`, in the custom argument parser's order).

    Args:
        collater: collates one mini-batch's list of graphs (e.g. a `FixedSizeCollater`).
        mini_batch_size: samples per mini-batch; None: the whole list is one mini-batch (a batch sampler's
            batch, which `poptorch.DataLoader` then combines with the next ones).
    """

    def __init__(self, collater: Callable[[list[Any]], Any], mini_batch_size: int | None = None):
        self.collater = collater
        self.mini_batch_size = mini_batch_size

    def __call__(self, batch: list[Any]) -> Any:
        size = self.mini_batch_size or len(batch)
        if len(batch) % size:
            raise ValueError(
                f"A combined batch of {len(batch)} samples does not split into mini-batches of {size}: use "
                "drop_last=True (poptorch.DataLoader's default) so every combined batch is whole."
            )
        mini_batches = [self.collater(batch[start : start + size]) for start in range(0, len(batch), size)]
        if len(mini_batches) == 1:
            return mini_batches[0]
        tensors = [flatten_custom(mini) for mini in mini_batches]
        return rebuild_custom(mini_batches[0], combine_batch_tensors_gen(tensors))
