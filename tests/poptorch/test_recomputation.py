"""recomputationCheckpoint recomputes: the checkpointed module runs again in backward, gradients unchanged.

Reference: the same model and data through the same wrapper without checkpoints (and a plain count of
forward calls: one per micro-batch without recomputation, two with it).
"""

import copy
import logging

import pytest
import torch
from torch import nn

import poptorch
from optimum.graphcore.modeling_utils import recomputation_checkpoint


class Counted(nn.Module):
    """Linear + dropout + tanh that counts its forward calls."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 6)
        self.dropout = nn.Dropout(0.3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.tanh(self.dropout(self.linear(x)))


class Net(nn.Module):
    def __init__(self, checkpoint: bool, blocks: bool = True):
        super().__init__()
        self.checkpoint = checkpoint
        self.layers = nn.ModuleList([Counted() for _ in range(3)])
        self.head = nn.Linear(6, 2)
        if blocks:
            poptorch.BeginBlock(self.layers[0], "L0", ipu_id=0)
            poptorch.BeginBlock(self.layers[2], "L2", ipu_id=1)

    def forward(self, x, y):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if self.checkpoint and i < 2:  # the Graphcore tutorials' pattern: every layer but the last
                x = poptorch.recomputationCheckpoint(x)
        return nn.functional.mse_loss(self.head(x), y)


def _train(model, opts, x, y):
    model.train()
    training = poptorch.trainingModel(model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    training.compile(x, y)
    for layer in model.layers:
        layer.calls = 0
    losses = [training(x, y) for _ in range(2)]
    training.destroy()
    return losses


def _options(ga=3):
    opts = poptorch.Options().randomSeed(0)
    opts.Training.gradientAccumulation(ga)
    return opts


def test_checkpointed_layers_run_again_in_backward_and_the_gradients_are_unchanged():
    torch.manual_seed(0)
    plain = Net(checkpoint=False)
    recomputed = copy.deepcopy(plain)
    recomputed.checkpoint = True
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 6, generator=g), torch.randn(6, 2, generator=g)  # GA 3 x micro-batch 2

    plain_losses = _train(plain, _options(), x, y)
    recomputed_losses = _train(recomputed, _options(), x, y)

    assert [layer.calls for layer in plain.layers] == [6, 6, 6]  # 2 calls x 3 micro-batches
    assert [layer.calls for layer in recomputed.layers] == [12, 12, 6]  # checkpointed: once more in backward
    for a, b in zip(plain_losses, recomputed_losses):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    for p, q in zip(plain.parameters(), recomputed.parameters()):  # dropout drew the same masks again
        torch.testing.assert_close(p, q, atol=1e-7, rtol=0)


def test_one_stage_recomputes_only_when_auto_recomputation_is_set():
    x, y = torch.randn(6, 6), torch.randn(6, 2)
    one_stage = Net(checkpoint=True, blocks=False)
    _train(one_stage, _options(), x, y)
    assert [layer.calls for layer in one_stage.layers] == [
        6,
        6,
        6,
    ]  # as PopTorch: no pipeline, no recomputation

    opts = _options()
    opts._Popart.set("autoRecomputation", 3)  # RecomputationType.Pipeline
    _train(one_stage, opts, x, y)
    assert [layer.calls for layer in one_stage.layers] == [12, 12, 6]


def test_inference_never_recomputes():
    model = Net(checkpoint=True).eval()
    inference = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    inference(torch.randn(4, 6), torch.randn(4, 2))
    assert [layer.calls for layer in model.layers] == [3, 3, 3]  # the compile trace + 2 micro-batches


def test_optimum_graphcore_recomputation_checkpoint_recomputes_the_hooked_module():
    torch.manual_seed(0)
    model = Net(checkpoint=False)
    reference = copy.deepcopy(model)
    handle = recomputation_checkpoint(model.layers[1])
    x, y = torch.randn(6, 6), torch.randn(6, 2)
    _train(model, _options(), x, y)
    _train(reference, _options(), x, y)
    assert [layer.calls for layer in model.layers] == [6, 12, 6]
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, atol=1e-7, rtol=0)
    handle.remove()
    assert "forward" not in vars(model.layers[1])  # the module is left as it was


def test_a_checkpoint_on_a_tensor_no_module_returned_splits_nothing_and_says_so(caplog):
    class Shifted(Net):
        def forward(self, x, y):
            x = poptorch.recomputationCheckpoint(self.layers[0](x) + 1)
            for layer in self.layers[1:]:
                x = layer(x)
            return nn.functional.mse_loss(self.head(x), y)

    model = Shifted(checkpoint=False)
    with caplog.at_level(logging.WARNING, logger="poptorch"):
        _train(model, _options(), torch.randn(6, 6), torch.randn(6, 2))
    assert "are not the output of a module" in caplog.text
    assert [layer.calls for layer in model.layers] == [6, 6, 6]


@pytest.fixture(autouse=True)
def _quiet():
    poptorch.setLogLevel("ERR")
    yield
    poptorch.setLogLevel("WARN")
