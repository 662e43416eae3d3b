"""PopTorch Geometric (`poptorch_geometric`): fixed-size graph batches and models on them.

References are independent of our code: torch_geometric's own batching (`Batch.from_data_list`) of the
same real graphs, a plain PyTorch training loop, and the plain model on torch_geometric's unpadded batch.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Batch, Data
from torch_geometric.datasets import FakeDataset
from torch_geometric.loader import DataLoader as PyGDataLoader
from torch_geometric.nn import GCNConv, GINConv, global_mean_pool

import optimum_ipu.poptorch_geometric
import poptorch
import poptorch_geometric
from poptorch_geometric import (
    FixedSizeDataLoader,
    FixedSizeOptions,
    FixedSizeStrategy,
    OverSizeStrategy,
)
from poptorch_geometric.collate import FixedSizeCollater
from poptorch_geometric.dataloader import DataLoader


def graphs(n=12, seed=0):
    """Small random graphs with node features, edge features and a class per graph."""
    torch.manual_seed(seed)
    return list(FakeDataset(num_graphs=n, avg_num_nodes=6, avg_degree=2, num_channels=3, edge_dim=2,
                            num_classes=2))  # fmt: skip


class GCN(torch.nn.Module):
    """A graph classifier that ignores padding: padding edges stay inside the padding graph, the loss
    covers real graphs only (`graphs_mask`)."""

    def __init__(self, num_graphs, conv="gcn"):
        super().__init__()
        torch.manual_seed(1)
        self.num_graphs = num_graphs
        if conv == "gcn":
            self.conv = GCNConv(3, 8, add_self_loops=False)
        else:
            self.conv = GINConv(torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)))
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x, edge_index, batch, graphs_mask=None, y=None):
        h = self.conv(x, edge_index).relu()
        out = self.head(global_mean_pool(h, batch, size=self.num_graphs))
        if y is None:
            return out
        return out, F.cross_entropy(out[graphs_mask], y[graphs_mask])


def real_part(batch, reference):
    """The padded `batch` cut to the real graphs' nodes, edges and graphs of `reference`."""
    n, e, g = reference.num_nodes, reference.num_edges, reference.num_graphs
    return batch.x[:n], batch.edge_index[:, :e], batch.edge_attr[:e], batch.y[:g], batch.batch[:n]


def test_alias_is_the_implementation():
    assert poptorch_geometric is optimum_ipu.poptorch_geometric
    import poptorch_geometric.dataloader as alias

    assert alias.FixedSizeDataLoader is optimum_ipu.poptorch_geometric.dataloader.FixedSizeDataLoader


def test_pad_to_max_equals_pyg_batching_of_the_real_graphs():
    data = graphs()
    loader = FixedSizeDataLoader(data, batch_size=4)  # 3 real graphs + 1 padding graph each
    opts = loader.fixed_size_options
    largest_nodes = max(d.num_nodes for d in data)
    assert opts.num_nodes == largest_nodes * 3 + 1  # room for the 3 largest graphs and a padding node
    batches = list(loader)
    assert len(batches) == 4
    for i, batch in enumerate(batches):
        reference = Batch.from_data_list(data[3 * i : 3 * i + 3])
        assert batch.x.shape == (opts.num_nodes, 3) and batch.edge_index.shape == (2, opts.num_edges)
        assert batch.y.shape == (4,) and batch.batch.shape == (opts.num_nodes,)
        for ours, theirs in zip(real_part(batch, reference), (reference.x, reference.edge_index,
                                reference.edge_attr, reference.y, reference.batch)):  # fmt: skip
            torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        assert batch.graphs_mask.tolist() == [True, True, True, False]
        assert batch.nodes_mask.sum() == reference.num_nodes and batch.edges_mask.sum() == reference.num_edges
        # The padding: nodes of graph 3, edges joining padding nodes only, zero features.
        assert (batch.batch[reference.num_nodes :] == 3).all()
        assert (batch.edge_index[:, reference.num_edges :] >= reference.num_nodes).all()
        assert (batch.x[reference.num_nodes :] == 0).all() and (batch.edge_attr[reference.num_edges :] == 0).all()


def test_stream_pack_covers_every_graph_once_within_the_fixed_size():
    data = graphs(20)
    opts = FixedSizeOptions(num_nodes=30, num_edges=60, num_graphs=5)
    loader = FixedSizeDataLoader(data, batch_size=5, fixed_size_options=opts,
                                 fixed_size_strategy=FixedSizeStrategy.StreamPack, drop_last=False)  # fmt: skip
    seen = 0
    for batch in loader:
        real = int(batch.graphs_mask.sum())
        assert batch.x.shape[0] == 30 and batch.edge_index.shape[1] == 60 and batch.y.shape[0] == 5
        reference = Batch.from_data_list(data[seen : seen + real])
        torch.testing.assert_close(batch.x[: reference.num_nodes], reference.x)
        torch.testing.assert_close(batch.edge_index[:, : reference.num_edges], reference.edge_index)
        assert int(batch.nodes_mask.sum()) == reference.num_nodes <= 29
        seen += real
    assert seen == len(data)


def test_combined_batch_holds_consecutive_mini_batches_on_dim_0():
    data = graphs()
    opts = poptorch.Options().deviceIterations(2)
    loader = FixedSizeDataLoader(data, batch_size=3, options=opts)  # 2 real graphs per mini-batch
    fixed = loader.fixed_size_options
    items = list(loader)
    assert len(items) == 3  # 12 graphs / (2 per mini-batch x 2 device iterations)
    for i, item in enumerate(items):
        assert item.x.shape[0] == 2 * fixed.num_nodes and item.edge_index.shape == (4, fixed.num_edges)
        for d in range(2):  # each device iteration's rows: a padded mini-batch of the next two graphs
            reference = Batch.from_data_list(data[4 * i + 2 * d : 4 * i + 2 * d + 2])
            nodes = slice(d * fixed.num_nodes, d * fixed.num_nodes + reference.num_nodes)
            torch.testing.assert_close(item.x[nodes], reference.x)
            torch.testing.assert_close(item.edge_index[2 * d : 2 * d + 2, : reference.num_edges], reference.edge_index)
            torch.testing.assert_close(item.batch[nodes], reference.batch)


@pytest.mark.parametrize("conv", ["gcn", "gin"])
def test_inference_equals_the_plain_model_on_the_real_graphs(conv):
    data = graphs()
    loader = FixedSizeDataLoader(data, batch_size=4)
    model = GCN(4, conv).eval()
    ipu = poptorch.inferenceModel(model)
    for i, batch in enumerate(loader):
        out = ipu(batch.x, batch.edge_index, batch.batch)
        reference = Batch.from_data_list(data[3 * i : 3 * i + 3])
        plain = GCN(3, conv).eval()
        plain.load_state_dict(model.state_dict())
        with torch.no_grad():
            expected = plain(reference.x, reference.edge_index, reference.batch)
        torch.testing.assert_close(out[batch.graphs_mask], expected, rtol=1e-5, atol=1e-6)


def test_training_equals_a_plain_pytorch_loop_on_the_same_padded_batches():
    data = graphs(16)
    opts = poptorch.Options().deviceIterations(2)
    loader = FixedSizeDataLoader(data, batch_size=3, options=opts)
    fixed = loader.fixed_size_options
    model = GCN(3)
    plain = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, opts, optimizer=poptorch.optim.SGD(model.parameters(), lr=0.1))
    sgd = torch.optim.SGD(plain.parameters(), lr=0.1)
    plain_losses, ipu_losses = [], []
    for item in loader:
        _, loss = ipu(item.x, item.edge_index, item.batch, item.graphs_mask, item.y)
        ipu_losses.append(float(loss))
        for d in range(2):  # the reference: one optimizer step per mini-batch (device iteration)
            n, g = slice(d * fixed.num_nodes, (d + 1) * fixed.num_nodes), slice(3 * d, 3 * d + 3)
            sgd.zero_grad()
            _, step_loss = plain(item.x[n], item.edge_index[2 * d : 2 * d + 2], item.batch[n],
                                 item.graphs_mask[g], item.y[g])  # fmt: skip
            step_loss.backward()
            sgd.step()
        plain_losses.append(float(step_loss))  # a training call returns its last device iteration's loss
    assert len(ipu_losses) == 4
    assert ipu_losses == pytest.approx(plain_losses, rel=1e-5)
    ipu.copyWeightsToHost()
    for ours, theirs in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_data_loader_gives_pyg_batches():
    data = graphs(6)
    ours = list(DataLoader(data, batch_size=2))
    theirs = list(PyGDataLoader(data, batch_size=2))
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        for key in ("x", "edge_index", "edge_attr", "y", "batch", "ptr"):
            torch.testing.assert_close(a[key], b[key])


def test_whole_batch_as_a_model_argument():
    """`Data`/`Batch` are registered custom argument types: a model may take the batch itself."""

    class TakesBatch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = GCN(4).eval()

        def forward(self, data):
            return self.inner(data.x, data.edge_index, data.batch)

    data = graphs(6)
    batch = next(iter(FixedSizeDataLoader(data, batch_size=4)))
    model = TakesBatch()
    expected = model(batch)
    torch.testing.assert_close(poptorch.inferenceModel(model)(batch), expected)


def test_trim_edges_keeps_the_first_edges_and_fills_the_size():
    data = graphs(4)
    total_edges = sum(d.num_edges for d in data[:3])
    opts = FixedSizeOptions(num_nodes=100, num_edges=total_edges - 5, num_graphs=4)
    batch = FixedSizeCollater(opts, add_masks_to_batch=True, trim_edges=True)(data[:3])
    reference = Batch.from_data_list(data[:3])
    assert batch.edge_index.shape == (2, total_edges - 5) and bool(batch.edges_mask.all())
    torch.testing.assert_close(batch.edge_index, reference.edge_index[:, : total_edges - 5])


def test_bad_sizes_say_what_to_change():
    data = graphs(6)
    with pytest.raises(ValueError, match="at least 2 graphs"):
        FixedSizeOptions(num_nodes=10, num_graphs=1)
    with pytest.raises(ValueError, match="must match provided batch size"):
        FixedSizeDataLoader(data, batch_size=3, fixed_size_options=FixedSizeOptions(num_nodes=50, num_graphs=4))
    small = FixedSizeDataLoader(data, batch_size=4, fixed_size_options=FixedSizeOptions(5, 200, num_graphs=4))
    with pytest.raises(RuntimeError, match="Increase num_nodes"):
        next(iter(small))
    with pytest.raises(RuntimeError, match="at most 2 real graphs"):
        FixedSizeCollater(FixedSizeOptions(100, 200, num_graphs=3))(data[:3])
    with pytest.raises(TypeError, match="collate_fn"):
        FixedSizeDataLoader(data, batch_size=4, collate_fn=list)


def test_skip_without_stream_pack_warns_once(caplog):
    data = graphs(6)
    with caplog.at_level("WARNING"):
        FixedSizeDataLoader(data, batch_size=4, over_size_strategy=OverSizeStrategy.Skip)
    assert "no effect with FixedSizeStrategy.PadToMax" in caplog.text


def test_padding_graph_keeps_non_tensor_attributes():
    data = [Data(x=torch.ones(n, 3), edge_index=torch.tensor([[0], [n - 1]]), y=torch.tensor([1]), name=f"g{n}")
            for n in (2, 3)]  # fmt: skip
    batch = FixedSizeCollater(FixedSizeOptions(8, 4, num_graphs=3), add_masks_to_batch=True)(data)
    assert batch.name == ["g2", "g3", ""]
    assert batch.y.tolist() == [1, 1, 0] and batch.x.shape == (8, 3)


def test_sampling_loaders_are_refused_with_the_reason():
    from poptorch_geometric.cluster_loader import FixedSizeClusterLoader
    from poptorch_geometric.neighbor_loader import FixedSizeNeighborLoader

    for loader in (FixedSizeNeighborLoader, FixedSizeClusterLoader):
        with pytest.raises(NotImplementedError, match="pyg-lib or torch-sparse"):
            loader(graphs(2)[0], batch_size=2)


def test_options_from_a_loader_fit_its_largest_batch_plus_padding():
    data = graphs(9)
    loader = PyGDataLoader(data, batch_size=3)
    opts = FixedSizeOptions.from_loader(loader)
    batches = list(loader)
    assert opts.num_graphs == 4
    assert opts.num_nodes == max(b.num_nodes for b in batches) + 1
    assert opts.num_edges == max(b.num_edges for b in batches) + 1


def test_stream_pack_combined_batches_are_consecutive_packed_mini_batches():
    data = graphs(20)
    opts = FixedSizeOptions(num_nodes=30, num_edges=60, num_graphs=5)
    loader = FixedSizeDataLoader(data, batch_size=5, fixed_size_options=opts, options=poptorch.Options().deviceIterations(2),
                                 fixed_size_strategy=FixedSizeStrategy.StreamPack)  # fmt: skip
    seen = 0
    for item in loader:
        assert item.x.shape == (60, 3) and item.edge_index.shape == (4, 60) and item.graphs_mask.shape == (10,)
        for d in range(2):
            real = int(item.graphs_mask[5 * d : 5 * d + 5].sum())
            reference = Batch.from_data_list(data[seen : seen + real])
            torch.testing.assert_close(item.x[30 * d : 30 * d + reference.num_nodes], reference.x)
            torch.testing.assert_close(item.edge_index[2 * d : 2 * d + 2, : reference.num_edges], reference.edge_index)
            seen += real
    assert seen > len(data) // 2  # whole pairs of packed mini-batches; an odd last one is dropped (drop_last)


def test_trim_nodes_keeps_each_graphs_first_nodes_and_one_padding_node():
    data = graphs(4)[:3]
    total = sum(d.num_nodes for d in data)
    opts = FixedSizeOptions(num_nodes=total - 4, num_edges=200, num_graphs=4)
    batch = FixedSizeCollater(opts, add_masks_to_batch=True, trim_nodes=True)(data)
    assert batch.x.shape[0] == total - 4 and int(batch.nodes_mask.sum()) == total - 5  # one padding node left
    kept = [int((batch.batch[batch.nodes_mask] == g).sum()) for g in range(3)]
    assert all(k >= 1 for k in kept) and sum(kept) == total - 5
    start = 0
    for graph, k in zip(data, kept):  # each graph keeps its first k nodes, features unchanged
        torch.testing.assert_close(batch.x[start : start + k], graph.x[:k])
        start += k
    real_edges = batch.edge_index[:, batch.edges_mask]
    assert bool((real_edges < total - 5).all())  # no real edge points at a removed or padding node
