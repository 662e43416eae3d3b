"""Buffers in a compiled model, as PopTorch 3.4 keeps them (its user guide, "PyTorch buffers"; its
buffers_test.py): updated in place once per micro-batch, refused under replicas unless each replica keeps
its own (`broadcastBuffers(False)`), and copied to the device by name (`copyNamedBuffersToDevice`)."""

import copy

import pytest
import torch
from torch import nn

import poptorch


class TwoBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buffer_1", torch.ones(1))
        self.register_buffer("buffer_2", torch.ones(1))

    def forward(self, x):
        return torch.sum(x + self.buffer_1 + self.buffer_2)


def _updatable(*names):
    opts = poptorch.Options()
    opts.updatableNamedBuffers(list(names))
    return opts


def test_copy_named_buffers_to_device_copies_the_named_buffers_only():
    model = poptorch.inferenceModel(TwoBuffers(), _updatable("buffer_1"))
    x = torch.ones(3)
    assert model(x) == 9
    model.buffer_1.copy_(model.buffer_1 + 1)
    model.copyNamedBuffersToDevice()
    assert model(x) == 12
    model.buffer_2.copy_(model.buffer_2 + 1)  # not updatable: the device keeps its value
    model.copyNamedBuffersToDevice()
    assert model(x) == 12


def test_copy_named_buffers_to_device_without_updatable_buffers_is_poptorchs_error():
    model = poptorch.inferenceModel(TwoBuffers())
    x = torch.ones(3)
    assert model(x) == 9
    model.buffer_1.copy_(model.buffer_1 + 1)
    with pytest.raises(poptorch.Error, match="No named buffers marked as updatable via updatableNamedBuffers"):
        model.copyNamedBuffersToDevice()
    assert model(x) == 9


def test_an_updatable_buffer_the_model_lacks_is_refused_at_compile_naming_the_buffers():
    model = poptorch.inferenceModel(TwoBuffers(), _updatable("non_existing_buffer"))
    with pytest.raises(poptorch.Error, match=r"Invalid updatable buffer 'non_existing_buffer'.*buffer_1, buffer_2"):
        model(torch.ones(3))


class BufferUpdating(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 1)
        self.register_buffer("test_buff", torch.zeros(2))

    def forward(self, inp, target):
        x = self.conv(inp)
        with torch.no_grad():
            self.test_buff += self.conv.bias[0]
        return x, nn.functional.l1_loss(x, target)


@pytest.mark.parametrize(("device_iterations", "accumulation"), [(3, 1), (1, 3), (3, 3)])
def test_buffer_updates_follow_the_cpu_loop_under_device_iterations_and_accumulation(device_iterations, accumulation):
    model = BufferUpdating()
    with torch.no_grad():
        model.conv.weight.fill_(1.0)
        model.conv.bias.fill_(1.0)
    reference = copy.deepcopy(model)
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    inp = torch.ones(2, 2, 2, 2)
    for _ in range(4 * device_iterations):  # what 4 calls run
        sgd.zero_grad()
        for _ in range(accumulation):
            (reference(inp, torch.zeros_like(inp))[1] / accumulation).backward()
        sgd.step()
    opts = poptorch.Options()
    opts.deviceIterations(device_iterations)
    opts.Training.gradientAccumulation(accumulation)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.ones(2 * device_iterations * accumulation, 2, 2, 2)
    for _ in range(4):
        training(x, torch.zeros_like(x))
    torch.testing.assert_close(model.conv.bias, reference.conv.bias)
    torch.testing.assert_close(model.test_buff, reference.test_buff)


def test_a_buffer_updated_under_replicas_is_poptorchs_error_naming_broadcast_buffers():
    model = BufferUpdating()
    opts = poptorch.Options()
    opts.replicationFactor(2)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match=r"does not support broadcasting buffers.*broadcastBuffers\(False\)"):
        training(torch.ones(4, 2, 2, 2), torch.zeros(4, 2, 2, 2))


def test_batch_norm_statistics_under_replicas_are_not_refused():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    opts = poptorch.Options()
    opts.replicationFactor(2)
    out = poptorch.inferenceModel(model.train(), opts)(torch.randn(8, 3))
    assert out.shape == (8, 3)


@pytest.mark.parametrize("broadcast", [True, False])
def test_batch_norm_statistics_under_replicas_follow_each_replicas_own_micro_batches(broadcast):
    """Replicas run side by side, each updating its own running statistics from its own micro-batches: after
    a call of 2 replicas x 2 accumulation steps the host holds replica 0's, as a plain BatchNorm run on its
    2 micro-batches leaves them (the momentum applied twice, not four times), whatever broadcastBuffers."""
    torch.manual_seed(0)

    class Normalised(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.linear = nn.BatchNorm1d(3), nn.Linear(3, 1)

        def forward(self, x):
            out = self.linear(self.norm(x))
            return out, out.pow(2).mean()

    model = Normalised()
    reference = copy.deepcopy(model.norm)
    x = torch.randn(16, 3) * 3 + 1  # [GA 2][replica 2][micro-batch 4]
    opts = poptorch.Options().replicationFactor(2).broadcastBuffers(broadcast)
    opts.Training.gradientAccumulation(2)
    poptorch.trainingModel(model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.0))(x)
    for step in range(2):
        reference(x.view(2, 2, 4, 3)[step, 0])
    torch.testing.assert_close(model.norm.running_mean, reference.running_mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(model.norm.running_var, reference.running_var, rtol=0, atol=1e-6)
    assert int(model.norm.num_batches_tracked) == 2


def test_without_broadcast_each_replica_keeps_its_own_buffers():
    class ReplicaBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buffer", torch.zeros(1, 2))

        def forward(self, x):
            self.buffer.copy_(self.buffer + x)
            return poptorch.identity_loss(self.buffer, reduction="none")

    opts = poptorch.Options()
    opts.replicationFactor(2)
    opts.broadcastBuffers(False)
    model = poptorch.inferenceModel(ReplicaBuffer(), opts)
    x = torch.tensor([[9.0], [2.0]])
    for _ in range(50):
        y = model(x)
    assert torch.equal(y, torch.tensor([[450.0, 450.0], [100.0, 100.0]]))
    model.copyWeightsToHost()
    assert torch.equal(model.buffer, torch.tensor([[450.0, 450.0]]))  # the first replica's
