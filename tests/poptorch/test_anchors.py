"""Anchored tensors (Graphcore's "observing tensors" tutorial): gradients, updated weights and weights of
each update, picked by the anchor's output mode, against a plain PyTorch loop."""

import copy

import pytest
import torch
from torch import nn

import poptorch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, x, labels=None):
        out = self.fc2(torch.relu(self.fc1(x)))
        return out if labels is None else (out, nn.functional.cross_entropy(out, labels))


def _plain_updates(model, x, labels, di, mb, lr):
    """Per update (device iteration): fc2.bias's gradient, fc1.weight before and after."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    gradients, before, after = [], [], []
    for d in range(di):
        optimizer.zero_grad()
        rows = slice(d * mb, (d + 1) * mb)
        model(x[rows], labels[rows])[1].backward()
        gradients.append(model.fc2.bias.grad.clone())
        before.append(model.fc1.weight.detach().clone())
        optimizer.step()
        after.append(model.fc1.weight.detach().clone())
    return torch.stack(gradients), torch.stack(before), torch.stack(after)


@pytest.mark.parametrize(
    ("mode", "pick"),
    [
        (poptorch.OutputMode.All, lambda t: t),
        (poptorch.OutputMode.Sum, lambda t: t.sum(0)),
        (poptorch.OutputMode.Final, lambda t: t[-1]),
        (poptorch.OutputMode.EveryN, lambda t: t[1::2]),
        (None, lambda t: t[-1]),  # the model's output mode: Final in training
    ],
)
def test_training_anchors_hold_each_updates_gradient_and_weights(mode, pick):
    torch.manual_seed(0)
    model, di, mb = Net(), 4, 3
    reference = copy.deepcopy(model)
    x, labels = torch.randn(di * mb, 6), torch.randint(0, 3, (di * mb,))
    opts = poptorch.Options().deviceIterations(di)
    for short, long in (("grad", "Gradient___fc2.bias"), ("weight", "fc1.weight"), ("new", "UpdatedVar___fc1.weight")):
        opts.anchorTensor(short, long, mode, output_return_period=2)
    training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    training(x, labels)
    gradients, before, after = _plain_updates(reference, x, labels, di, mb, lr=0.1)
    torch.testing.assert_close(training.getAnchoredTensor("grad"), pick(gradients), atol=1e-6, rtol=0)
    torch.testing.assert_close(training.getAnchoredTensor("weight"), pick(before), atol=1e-6, rtol=0)
    torch.testing.assert_close(training.getAnchoredTensor("new"), pick(after), atol=1e-6, rtol=0)
    assert {"fc1.weight", "Gradient___fc1.weight", "UpdatedVar___fc2.bias"} <= set(training.getTensorNames())


def test_anchor_names_are_checked_at_compile_and_lookups_fail_as_poptorchs():
    opts = poptorch.Options()
    opts.anchorTensor("g", "Gradient___fc9.weight")
    model = poptorch.trainingModel(Net(), opts)
    with pytest.raises(AssertionError, match="Model must be compiled before calling getTensorNames"):
        model.getTensorNames()
    with pytest.raises(poptorch.Error, match="no tensor 'Gradient___fc9.weight'.*getTensorNames"):
        model.compile(torch.randn(2, 6), torch.zeros(2, dtype=torch.long))
    inference_opts = poptorch.Options()
    inference_opts.anchorTensor("w", "UpdatedVar___fc1.weight")
    with pytest.raises(poptorch.Error, match="inference model has no gradients"):
        poptorch.inferenceModel(Net(), inference_opts)(torch.randn(2, 6))
    plain = poptorch.inferenceModel(Net())
    plain(torch.randn(2, 6))
    with pytest.raises(AssertionError, match="No tensor with name w found."):
        plain.getAnchoredTensor("w")


def test_an_inference_anchor_is_the_weight_of_each_iteration():
    model = Net()
    opts = poptorch.Options().deviceIterations(3)
    opts.anchorTensor("bias", "fc2.bias")
    inference = poptorch.inferenceModel(model, opts)
    inference(torch.randn(6, 6))
    assert torch.equal(inference.getAnchoredTensor("bias"), model.fc2.bias.detach().expand(3, 3))


@pytest.mark.parametrize("period", [0, -1, 2.5, True, "2"])
def test_an_every_n_anchor_period_must_be_a_positive_integer_as_for_output_mode(period):
    opts = poptorch.Options()
    with pytest.raises(AssertionError) as caught:
        opts.anchorTensor("grad", "Gradient___fc2.bias", poptorch.OutputMode.EveryN, period)
    message = str(caught.value)
    assert message.startswith("EveryN anchor must have output_return_period set to valid positive integer")
    assert "anchorTensor('grad', 'Gradient___fc2.bias'" in message and repr(period) in message
    assert "e.g. 2" in message
    assert "grad" not in opts.anchored_tensors
    with pytest.raises(AssertionError, match=f"outputMode got output_return_period={period!r}"):
        poptorch.Options().outputMode(poptorch.OutputMode.EveryN, period)


def test_an_every_n_anchor_period_is_only_checked_for_every_n():
    opts = poptorch.Options()
    opts.anchorTensor("a", "fc1.weight", poptorch.OutputMode.All, 0)
    opts.anchorTensor("b", "fc1.weight", poptorch.OutputMode.EveryN, 3)
    assert opts.anchored_tensors["a"][2] == 1 and opts.anchored_tensors["b"][2] == 3
