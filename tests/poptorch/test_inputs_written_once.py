"""A call writes the caller's inputs and the model's buffers once, the first call (which compiles) included.

PopTorch compiles without running the user's `forward()` on the caller's tensors: an in-place update of an
input, or of a buffer, is the graph's, applied once per call (PopTorch's `inplace_test.py`, `buffers_test.py`).
The expected numbers are worked by hand: one `+= 1` per call.
"""

import torch
from torch import nn

import poptorch


class AddsOneToItsInput(nn.Module):
    def forward(self, x):
        x += 1
        return x * 1


class AddsOneAndLearns(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(1, 1)

    def forward(self, x):
        x += 1
        return poptorch.identity_loss(self.linear(x).sum(), reduction="sum")


def test_an_input_updated_in_place_is_written_once_by_the_first_inference_call():
    x = torch.zeros(1, 1)
    model = poptorch.inferenceModel(AddsOneToItsInput())
    out = model(x)
    torch.testing.assert_close(out, torch.ones(1, 1))
    torch.testing.assert_close(x, torch.ones(1, 1))  # the trace at compile did not add one too
    model(x)
    torch.testing.assert_close(x, torch.full((1, 1), 2.0))


def test_compile_alone_leaves_the_inputs_alone():
    x = torch.zeros(2, 1)
    model = poptorch.inferenceModel(AddsOneToItsInput())
    model.compile(x)
    torch.testing.assert_close(x, torch.zeros(2, 1))


def test_an_input_updated_in_place_is_written_once_by_the_first_training_call():
    x = torch.zeros(1, 1)
    model = poptorch.trainingModel(AddsOneAndLearns())
    model(x)
    torch.testing.assert_close(x, torch.ones(1, 1))


def test_a_buffer_updated_in_training_counts_one_update_per_micro_batch_from_the_first_call():
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))

    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return poptorch.identity_loss(self.net(x).pow(2).sum(), reduction="sum")

    opts = poptorch.Options().deviceIterations(2)
    model = poptorch.trainingModel(WithLoss(), opts)
    model(torch.randn(8, 2))  # two micro-batches of 4: two forward passes in train mode
    assert int(net[1].num_batches_tracked) == 2
    model(torch.randn(8, 2))
    assert int(net[1].num_batches_tracked) == 4
