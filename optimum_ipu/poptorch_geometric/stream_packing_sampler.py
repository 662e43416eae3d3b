"""`StreamPackingSampler`: batches of consecutive graphs packed while they fit (FixedSizeStrategy.StreamPack)."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import Sampler, SequentialSampler

__all__ = ["StreamPackingSampler"]


class StreamPackingSampler(Sampler[list[int]]):
    """Index batches of the graphs `base_sampler` gives, in its order: a graph joins the current batch while
    the batch then holds at most `max_num_graphs` graphs, `max_num_nodes` nodes and `max_num_edges` edges;
    otherwise the batch is yielded and a new one starts with it. So batches hold varied numbers of real graphs
    and waste less room on padding than a fixed count of graphs would.

    Args:
        data_source: the dataset (graphs with `num_nodes` and `num_edges`).
        max_num_graphs, max_num_nodes, max_num_edges: the room for real graphs (the padding's is left out).
        base_sampler: the order of the graphs (default: sequential).
        allow_skip_data: skip a graph that alone does not fit, instead of raising.
    """

    def __init__(self, data_source, max_num_graphs: int, max_num_nodes: int, max_num_edges: int,
                 base_sampler: Sampler | None = None, allow_skip_data: bool = False):  # fmt: skip
        super().__init__()
        self.data_source = data_source
        self.max_num_graphs = max_num_graphs
        self.max_num_nodes = max_num_nodes
        self.max_num_edges = max_num_edges
        self.base_sampler = base_sampler if base_sampler is not None else SequentialSampler(data_source)
        self.allow_skip_data = allow_skip_data

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        nodes = edges = 0
        for index in self.base_sampler:
            graph = self.data_source[index]
            n, e = graph.num_nodes, graph.num_edges
            if n > self.max_num_nodes or e > self.max_num_edges:
                if self.allow_skip_data:
                    continue
                raise RuntimeError(
                    f"Graph {index} ({n} nodes, {e} edges) does not fit a batch alone: the room for real graphs "
                    f"is {self.max_num_nodes} nodes and {self.max_num_edges} edges (the fixed sizes less the "
                    "padding). Increase num_nodes/num_edges, or use over_size_strategy=OverSizeStrategy.Skip."
                )
            if batch and (len(batch) == self.max_num_graphs or nodes + n > self.max_num_nodes
                          or edges + e > self.max_num_edges):  # fmt: skip
                yield batch
                batch, nodes, edges = [], 0, 0
            batch.append(index)
            nodes += n
            edges += e
        if batch:
            yield batch
