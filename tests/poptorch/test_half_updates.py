"""A half model's updates within one host call: the next micro-batches' fp32 copies of the weights are made in
the memory of the last update's fp32 working copies, with the bits of copies in fresh memory."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import poptorch
from optimum_ipu.runtime import fp16_compute, optimizers
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
def test_an_update_lends_its_working_copies_memory_to_the_next_micro_batches_fp32_copies(
    monkeypatch, accumulation, stochastic_rounding
):
    """With several micro-batches per update the wide weight is copied to fresh fp32 memory once a call, by the
    first update's micro-batches: later updates' copies go into the memory of the last update's working copies.
    With one micro-batch per update each op copies the weight itself, into fresh memory, as before. Outputs
    and weights are bit for bit those of fresh memory every time."""
    torch.manual_seed(0)
    base = _Wide().half()
    calls = _calls(2, 3 * accumulation * 2)
    results = {}
    for kept in (True, False):
        if not kept:  # the rule switched off: every update's copies in fresh memory
            monkeypatch.setattr(optimizers, "lend_fp32_memory", lambda weights, buffers: None)
        results[kept] = _train(
            copy.deepcopy(base), calls, device_iterations=3, accumulation=accumulation,
            stochastic_rounding=stochastic_rounding,
        )  # fmt: skip
    (outputs, weights, count), (fresh_outputs, fresh_weights, fresh_count) = results[True], results[False]
    assert _same(outputs, fresh_outputs)
    assert _same(weights, fresh_weights)
    if accumulation > 1:
        assert fresh_count == 2 * 3  # two calls of three updates, each copying the weight to fresh memory
        assert count == 2  # once per call: the first update's copy
    else:
        assert count == fresh_count == 2 * 3  # each micro-batch's forward; its backward reads that copy


def test_weights_written_from_the_host_between_calls_are_read_as_written():
    """A call after copyWeightsToDevice() of other weights trains from those, as a fresh model would."""
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


class _Clamped(_Wide):
    """A forward that clamps the wide weight through `.data` (a write its version counter does not see)."""

    def forward(self, x, labels):
        self.wide.weight.data.clamp_(-0.02, 0.02)
        return super().forward(x, labels)


def test_a_weight_written_through_data_in_the_forward_reaches_the_update_as_before(monkeypatch):
    """A `.data` write moves no version counter: each update's copies are still made from the fp16 weights as
    the forward left them at their first read, so the clamp acts as with fresh memory."""
    torch.manual_seed(0)
    base = _Clamped().half()
    calls = _calls(2, 12)
    kept = _train(copy.deepcopy(base), calls, device_iterations=3, accumulation=2, stochastic_rounding=False)
    monkeypatch.setattr(optimizers, "lend_fp32_memory", lambda weights, buffers: None)
    fresh = _train(copy.deepcopy(base), calls, device_iterations=3, accumulation=2, stochastic_rounding=False)
    assert _same(kept[0], fresh[0]) and _same(kept[1], fresh[1])


def test_values_an_optimizer_keeps_for_itself_are_left_alone():
    """An optimizer may put a parameter's data in a tensor of its own during the step (as optimizers keeping
    master or slow weights do): the write-back reads that tensor and nothing writes to it; only the working
    copy's memory is lent."""
    weight = nn.Parameter(torch.randn(128, 512).half())
    optimizer = torch.optim.SGD([weight], lr=0.1)
    with fp16_compute.fp32_memory_of_updates():
        with optimizers.fp32_working_copies(optimizer, {weight: torch.randn(128, 512)}, False, None):
            working_copy = weight.data
            optimizer.step()
            weight.data = mine = weight.data.clone()
        before = mine.clone()
        with fp16_compute.FP32Partials([weight]):
            out = torch.nn.functional.linear(_calls(1, 4)[0][0], weight)
    assert torch.equal(mine, before) and not torch.equal(mine, mine.half().float())  # its own fp32 values
    assert torch.equal(weight, mine.half())
    assert torch.equal(working_copy, weight.float())  # the copy for the linear layer, in the lent memory
    assert torch.equal(out, torch.nn.functional.linear(_calls(1, 4)[0][0].float(), weight.float()).half())
