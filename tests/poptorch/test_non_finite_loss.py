"""A non-finite loss in a PopTorch program: the update is applied as on the IPU, and the weights become NaN.

PopTorch 3.4 (`math_ops_test.py`) compares such steps with CPU torch: no update is skipped, with a static
loss scale or with PopART's automatic loss scaling (whose histogram only moves the scale). The reference is
the same step in plain PyTorch. IPUTrainer keeps skipping such updates (`tests/test_trainer.py`).
"""

import copy

import pytest
import torch
from torch import nn

import poptorch


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(2, 1)

    def forward(self, x, y):
        return nn.functional.mse_loss(self.linear(x).squeeze(-1), y)


def batch():
    return torch.tensor([[1.0, 2.0], [float("inf"), 1.0]]), torch.tensor([0.5, 1.0])


def plain_pytorch_step(module: nn.Module) -> nn.Module:
    reference = copy.deepcopy(module)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(*batch()).backward()
    optimizer.step()
    return reference


@pytest.mark.parametrize("automatic", [False, True], ids=["static scale", "automatic loss scaling"])
def test_an_update_with_a_non_finite_loss_is_applied_as_plain_pytorch_applies_it(automatic):
    module = Regression()
    reference = plain_pytorch_step(module)
    opts = poptorch.Options()
    opts.Training.setAutomaticLossScaling(automatic)
    model = poptorch.trainingModel(module, opts, optimizer=torch.optim.SGD(module.parameters(), lr=0.1))
    loss = model(*batch())
    assert not torch.isfinite(loss)
    model.copyWeightsToHost()
    for (name, weight), expected in zip(module.named_parameters(), reference.parameters()):
        assert not torch.isfinite(weight).all(), name
        torch.testing.assert_close(weight, expected, equal_nan=True)


def test_the_next_call_runs_on_from_the_non_finite_weights():
    module = Regression()
    model = poptorch.trainingModel(module, optimizer=torch.optim.SGD(module.parameters(), lr=0.1))
    model(*batch())
    loss = model(torch.ones(2, 2), torch.zeros(2))
    assert not torch.isfinite(loss)  # as on the IPU: nothing put the weights back
