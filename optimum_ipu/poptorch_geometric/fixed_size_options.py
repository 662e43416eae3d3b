"""`FixedSizeOptions`: the fixed numbers of nodes, edges and graphs every padded mini-batch has.

An IPU program is compiled for fixed tensor shapes, so PopTorch Geometric pads each mini-batch of graphs
up to these numbers with padding graphs (at least one, hence `num_graphs >= 2`). The numbers include the
padding: `num_nodes=N` means the batch's real nodes plus padding nodes are exactly N.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch_geometric.data import HeteroData
from torch_geometric.data.summary import Summary

__all__ = ["FixedSizeOptions"]


def check_num_graphs(num_graphs: int, what: str = "num_graphs") -> None:
    """A clear error when a batch has no room for one real graph and the padding graph."""
    if num_graphs < 2:
        raise ValueError(
            f"{what} is {num_graphs}, but a fixed-size batch holds at least 2 graphs: one or more real graphs "
            "and one graph reserved for padding the batch to its fixed size. Use batch_size/num_graphs >= 2 "
            "(batch_size=2 is one real graph per mini-batch)."
        )


class FixedSizeOptions:
    """How a mini-batch is padded to a fixed size.

    Args:
        num_nodes: nodes per padded mini-batch (real + padding); a dict per node type for `HeteroData`.
        num_edges: edges per padded mini-batch; default `num_nodes * (num_nodes - 1)` (a complete graph).
        num_graphs: graphs per padded mini-batch, at least 2 (one is reserved for padding).
        node_pad_value, edge_pad_value, graph_pad_value: the fill values of the padding graph's node,
            edge and graph-level tensors (default 0).
        pad_graph_defaults: values for the padding graph's non-tensor attributes, by name.
    """

    def __init__(
        self,
        num_nodes: int | dict,
        num_edges: int | dict | None = None,
        num_graphs: int = 2,
        node_pad_value: float | None = None,
        edge_pad_value: float | None = None,
        graph_pad_value: float | None = None,
        pad_graph_defaults: dict[str, Any] | None = None,
    ):
        check_num_graphs(num_graphs)
        self.num_nodes = num_nodes
        if not num_edges:
            total = sum(num_nodes.values()) if isinstance(num_nodes, dict) else num_nodes
            num_edges = total * (total - 1)
        self.num_edges = num_edges
        self.num_graphs = num_graphs
        self.node_pad_value = 0.0 if node_pad_value is None else node_pad_value
        self.edge_pad_value = 0.0 if edge_pad_value is None else edge_pad_value
        self.graph_pad_value = 0.0 if graph_pad_value is None else graph_pad_value
        self.pad_graph_defaults = dict(pad_graph_defaults or {})

    def is_hetero(self) -> bool:
        """Whether the numbers of nodes and edges are given per node and edge type."""
        return isinstance(self.num_nodes, dict) and isinstance(self.num_edges, dict)

    def to_hetero(self, node_types: Iterable, edge_types: Iterable) -> FixedSizeOptions:
        """Give every node and edge type the single number (for `HeteroData`); returns self."""
        if not isinstance(self.num_nodes, dict):
            self.num_nodes = {t: self.num_nodes for t in node_types}
        if not isinstance(self.num_edges, dict):
            self.num_edges = {t: self.num_edges for t in edge_types}
        return self

    @property
    def total_num_nodes(self) -> int:
        """Nodes per padded mini-batch, summed over node types."""
        return sum(self.num_nodes.values()) if isinstance(self.num_nodes, dict) else self.num_nodes

    @property
    def total_num_edges(self) -> int:
        """Edges per padded mini-batch, summed over edge types."""
        return sum(self.num_edges.values()) if isinstance(self.num_edges, dict) else self.num_edges

    @classmethod
    def from_dataset(
        cls, dataset, batch_size: int, sample_limit: int | None = None, progress_bar: bool | None = None
    ) -> FixedSizeOptions:
        """Sizes that always fit `batch_size - 1` of the dataset's graphs plus a padding graph.

        The largest graph's nodes (edges) times `batch_size - 1`, plus one node (edge) for the padding
        graph, as PopTorch Geometric sizes it. `sample_limit` is accepted for PopTorch Geometric
        compatibility; the whole dataset is summarised.
        """
        check_num_graphs(batch_size, "batch_size")
        summary = Summary.from_dataset(dataset, progress_bar=progress_bar)

        def most(largest: float) -> int:
            return int(largest) * (batch_size - 1) + 1

        if summary.num_nodes_per_type:
            num_nodes = {t: most(s.max) for t, s in summary.num_nodes_per_type.items()}
        else:
            num_nodes = most(summary.num_nodes.max)
        if summary.num_edges_per_type:
            num_edges = {t: most(s.max) for t, s in summary.num_edges_per_type.items()}
        else:
            num_edges = most(summary.num_edges.max)
        return cls(num_nodes=num_nodes, num_edges=num_edges, num_graphs=batch_size)

    @classmethod
    def from_loader(cls, loader, sample_limit: int = 1000) -> FixedSizeOptions:
        """Sizes that fit the largest of up to `sample_limit` mini-batches `loader` yields, plus one graph,
        node and edge of padding: an estimate, as a sampling loader may later yield a larger one."""
        most_nodes: Any = None
        most_edges: Any = None
        most_graphs = 0
        seen = 0
        while seen < sample_limit:
            before = seen
            for data in loader:
                if seen >= sample_limit:
                    break
                seen += 1
                if isinstance(data, HeteroData):
                    most_nodes = most_nodes or {}
                    most_edges = most_edges or {}
                    for t in data.node_types:
                        most_nodes[t] = max(most_nodes.get(t, 0), data[t].num_nodes)
                    for t in data.edge_types:
                        most_edges[t] = max(most_edges.get(t, 0), data[t].num_edges)
                else:
                    most_nodes = max(most_nodes or 0, data.num_nodes)
                    most_edges = max(most_edges or 0, data.num_edges)
                most_graphs = max(most_graphs, getattr(data, "num_graphs", 1))
            if seen == before:
                break  # an empty loader
        if most_nodes is None:
            raise ValueError("FixedSizeOptions.from_loader: the loader yielded no mini-batch to measure.")
        if isinstance(most_nodes, dict):
            return cls(
                num_nodes={t: n + 1 for t, n in most_nodes.items()},
                num_edges={t: n + 1 for t, n in most_edges.items()},
                num_graphs=most_graphs + 1,
            )
        return cls(num_nodes=most_nodes + 1, num_edges=most_edges + 1, num_graphs=most_graphs + 1)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_nodes={self.num_nodes} (At least one node reserved for padding), "
            f"num_edges={self.num_edges} (At least one edge reserved for padding), "
            f"num_graphs={self.num_graphs} (At least one graph reserved for padding), "
            f"node_pad_value={self.node_pad_value}, edge_pad_value={self.edge_pad_value}, "
            f"graph_pad_value={self.graph_pad_value}, pad_graph_defaults={self.pad_graph_defaults})"
        )
