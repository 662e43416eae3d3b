"""Custom argument types (`poptorch.ICustomArgParser`, `registerCustomArgParser`): the wrappers find their
tensors, split them into micro-batches and rebuild the argument, as for tuples and dicts."""

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils import _pytree as pytree

import poptorch
from optimum_ipu.poptorch import custom_args


class Graph:
    """A PyTorch Geometric-like batch: features and targets held as attributes, plus a non-tensor tag."""

    def __init__(self, x, y, tag="g"):
        self.x, self.y, self.tag = x, y, tag


class GraphParser(poptorch.ICustomArgParser):
    def yieldTensors(self, struct):
        yield struct.x
        yield struct.y

    def reconstruct(self, original_structure, tensor_iterator):
        return type(original_structure)(next(tensor_iterator), next(tensor_iterator), original_structure.tag)


class SubGraph(Graph):
    pass


@pytest.fixture(autouse=True)
def _graph_parser():
    poptorch.registerCustomArgParser(Graph, GraphParser())
    yield
    poptorch.registerCustomArgParser(Graph, None)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)
        self.seen = []

    def forward(self, graph):
        self.seen.append((graph.x.shape[0], graph.tag))
        out = self.linear(graph.x)
        return out, F.mse_loss(out, graph.y)


def test_an_inference_model_splits_a_custom_argument_into_micro_batches():
    model = Net()
    graph = Graph(torch.randn(8, 3), torch.randn(8, 1), tag="molecules")
    out, _ = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(4))(graph)
    assert model.seen[-4:] == [(2, "molecules")] * 4  # each micro-batch a Graph of 2 rows, its tag kept
    torch.testing.assert_close(out, model.linear(graph.x))


def test_a_training_model_with_a_custom_argument_trains_as_the_plain_loop():
    torch.manual_seed(0)
    model = Net()
    plain = copy.deepcopy(model)
    graph = Graph(torch.randn(8, 3), torch.randn(8, 1))
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))(graph)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for half in (slice(0, 4), slice(4, 8)):
        (plain(Graph(graph.x[half], graph.y[half]))[1] / 2).backward()
    opt.step()
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_a_parser_must_implement_the_interface_and_none_removes_it():
    with pytest.raises(poptorch.Error, match="arg_parser must inherit from ICustomArgParser"):
        poptorch.registerCustomArgParser(Graph, object())
    graph = Graph(torch.ones(2, 3), torch.zeros(2, 1))
    assert len(pytree.tree_leaves([graph])) == 2
    poptorch.registerCustomArgParser(Graph, None)
    assert custom_args.flatten_custom([graph]) == [] and pytree.tree_leaves([graph]) == []


def test_flatten_and_rebuild_follow_poptorchs_walk_and_subclasses_use_their_bases_parser():
    a, b, c = torch.ones(1), torch.zeros(1), torch.full((1,), 2.0)
    structure = {"graph": SubGraph(a, b, tag="sub"), "extra": (c, "text")}
    assert [t.item() for t in custom_args.flatten_custom(structure)] == [1.0, 0.0, 2.0]
    rebuilt = custom_args.rebuild_custom(structure, [a + 10, b + 10, c + 10])
    assert isinstance(rebuilt["graph"], SubGraph) and rebuilt["graph"].tag == "sub"
    assert (rebuilt["graph"].x.item(), rebuilt["graph"].y.item(), rebuilt["extra"]) == (
        11.0,
        10.0,
        (c + 10, "text"),
    )
    # pytree matches exact types: a subclass is walked once registered from the arguments that hold it.
    tensors = lambda tree: [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor)]  # noqa: E731
    assert tensors(structure) == [c]
    custom_args.register_subclasses_in(structure)
    assert [t.item() for t in tensors(structure)] == [1.0, 0.0, 2.0]
