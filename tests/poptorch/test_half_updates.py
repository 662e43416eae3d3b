"""A half model's update within one host call: the fp32 values the update computed are what the next
micro-batches read, with the bits of a fresh conversion of the fp16 weights."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import poptorch
from optimum_ipu.runtime import optimizers
from tests.runtime.test_fp16_compute import _Conversions


class _Wide(nn.Module):
    """One linear layer at the fp16 layer's weight-size threshold (512 x 128 = 65,536) and a small head."""

    def __init__(self):
        super().__init__()
        self.wide, self.head = nn.Linear(512, 128), nn.Linear(128, 4)

    def forward(self, x, labels):
        logits = self.head(torch.relu(self.wide(x)))
        return logits, nn.functional.cross_entropy(logits.float(), labels)


def _train(model, calls, *, device_iterations, accumulation, stochastic_rounding, momentum=0.9):
    """Train `model` over `calls`; return the calls' outputs, the weights after, and how often the wide weight
    was converted to fp32 in the calls (the compilation, which traces the model once, not counted)."""
    opts = poptorch.Options().deviceIterations(device_iterations)
    opts.Training.gradientAccumulation(accumulation)
    opts.Precision.enableStochasticRounding(stochastic_rounding)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    training.compile(*calls[0])
    with _Conversions(model.wide.weight.numel()) as conversions:
        outputs = [training(x, y) for x, y in calls]
    training.copyWeightsToHost()
    return outputs, [p.detach().clone() for p in model.parameters()], conversions.count


def _same(a, b) -> bool:
    """Bit-equal tensors, or tuples of them (a call returns the model's (logits, loss))."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def _calls(n, rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, 512, generator=g).half(), torch.randint(0, 4, (rows,), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("accumulation", [1, 2])
@pytest.mark.parametrize("stochastic_rounding", [False, True])
def test_an_update_hands_its_fp32_values_to_the_next_micro_batches_of_the_call(
    monkeypatch, accumulation, stochastic_rounding
):
    """With several micro-batches per update the wide weight is converted to fp32 once a call, by the first
    micro-batch: every later one reads the values the last update wrote back. With one micro-batch per update
    each op converts the weight itself (cheaper than reading a kept copy through an autograd function there).
    Outputs and weights are bit for bit those of converting the weights afresh after every update."""
    torch.manual_seed(0)
    base = _Wide().half()
    calls = _calls(2, 3 * accumulation * 2)
    results = {}
    for kept in (True, False):
        if not kept:  # the rule switched off: every update's weights are converted afresh
            monkeypatch.setattr(optimizers, "publish_fp32_values", lambda weights, values: None)
        results[kept] = _train(
            copy.deepcopy(base), calls, device_iterations=3, accumulation=accumulation,
            stochastic_rounding=stochastic_rounding,
        )  # fmt: skip
    (outputs, weights, count), (fresh_outputs, fresh_weights, fresh_count) = results[True], results[False]
    assert _same(outputs, fresh_outputs)
    assert _same(weights, fresh_weights)
    if accumulation > 1:
        assert fresh_count == 2 * 3  # two calls of three updates, each converting the weight afresh
        assert count == 2  # once per call: the first micro-batch's conversion
    else:
        assert count == fresh_count == 2 * 3  # each micro-batch's forward; its backward reads that copy


def test_weights_written_from_the_host_between_calls_are_read_as_written():
    """The values an update leaves are kept for its own call only: a call after copyWeightsToDevice() of other
    weights trains from those, as a fresh model would."""
    torch.manual_seed(0)
    model, other = _Wide().half(), _Wide().half()
    calls = _calls(2, 6, seed=1)
    opts = poptorch.Options().deviceIterations(3)
    training = poptorch.trainingModel(model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    training(*calls[0])
    model.load_state_dict(other.state_dict())
    training.copyWeightsToDevice()
    after = training(*calls[1])

    fresh_model = copy.deepcopy(other)
    fresh = poptorch.trainingModel(fresh_model, opts, optimizer=torch.optim.SGD(fresh_model.parameters(), lr=0.1))
    assert _same(after, fresh(*calls[1]))
