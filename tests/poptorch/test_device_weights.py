"""The compiled model's weights are apart from the host module's, and move only when PopTorch moves them.

PopTorch 3.4 (`weights_writing_test.py`, `buffers_test.py`, `_poplar_executor.py`): host -> device when the
model compiles or attaches and at `copyWeightsToDevice()`; device -> host at `copyWeightsToHost()` and after
a training call (lazily, at the host's first read); an inference model takes the weights a training model
of the same module copied to the host; buffers an inference model changes stay on the device. Every
reference below is plain PyTorch on the same weights.
"""

import copy

import pytest
import torch
from torch import nn

import poptorch


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 1)

    def forward(self, x, y=None):
        out = self.linear(x).squeeze(-1)
        return out if y is None else (out, nn.functional.mse_loss(out, y))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 3, generator=g), torch.randn(4, generator=g)


def sgd_step(module: nn.Module, lr: float = 0.1) -> None:
    """One plain PyTorch SGD step on `module`, on the host."""
    x, y = data()
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    module(x, y)[1].backward()
    optimizer.step()
    optimizer.zero_grad()


def test_a_host_change_reaches_an_inference_model_only_through_copy_weights_to_device():
    net = Regressor()
    x, _ = data()
    model = poptorch.inferenceModel(net)
    before = model(x)
    with torch.no_grad():
        net.linear.weight.add_(1.0)
    torch.testing.assert_close(model(x), before)  # the device still holds the compiled weights
    model.copyWeightsToDevice()
    with torch.no_grad():
        torch.testing.assert_close(model(x), net(x))


def test_training_the_host_module_does_not_change_the_training_models_weights():
    net = Regressor()
    reference = copy.deepcopy(net)
    model = poptorch.trainingModel(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    x, y = data()
    model(x, y)
    sgd_step(net, lr=5.0)  # a plain torch step on the host module, after wrapping
    model(x, y)  # runs on the device's weights: two updates, the host's step left out
    sgd_step(reference)
    sgd_step(reference)
    for p, q in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)  # and the host now holds the device's weights


def test_copy_weights_to_device_restores_weights_loaded_on_the_host_after_training():
    net = Regressor()
    saved = copy.deepcopy(net.state_dict())
    model = poptorch.trainingModel(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    x, y = data()
    first_loss = model(x, y)[1]
    model(x, y)
    net.load_state_dict(saved)
    model.copyWeightsToDevice()
    torch.testing.assert_close(model(x, y)[1], first_loss)


def test_the_wrappers_load_state_dict_writes_the_device_too():
    net = Regressor()
    saved = copy.deepcopy(net.state_dict())
    model = poptorch.inferenceModel(net)
    x, _ = data()
    before = model(x)
    with torch.no_grad():
        net.linear.weight.add_(1.0)
    model.copyWeightsToDevice()
    model.load_state_dict(saved)
    torch.testing.assert_close(model(x), before)


def test_attaching_again_writes_the_hosts_weights_to_the_device():
    net = Regressor()
    model = poptorch.inferenceModel(net)
    x, _ = data()
    model(x)
    model.detachFromDevice()
    with torch.no_grad():
        net.linear.bias.add_(1.0)
        expected = net(x)
    torch.testing.assert_close(model(x), expected)  # the call attaches, which copies host -> device


def test_an_inference_model_takes_each_training_calls_weights_without_detaching():
    net = Regressor()
    reference = copy.deepcopy(net)
    training = poptorch.trainingModel(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    inference = poptorch.inferenceModel(net)
    x, y = data()
    inference(x)
    for _ in range(2):
        training(x, y)
        sgd_step(reference)
        with torch.no_grad():
            torch.testing.assert_close(inference(x), reference(x))


class BufferCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("i", torch.tensor([0.0]))

    def forward(self):
        self.i += 1
        return self.i


def test_buffers_an_inference_model_changes_reach_the_host_only_at_copy_weights_to_host():
    net = BufferCounter()
    model = poptorch.inferenceModel(net)
    assert [model().item(), model().item()] == [1.0, 2.0]
    torch.testing.assert_close(net.i, torch.tensor([0.0]))
    model.copyWeightsToHost()
    torch.testing.assert_close(net.i, torch.tensor([2.0]))


def test_a_returned_buffer_keeps_the_value_of_its_call():
    model = poptorch.inferenceModel(BufferCounter())
    first = model()
    model()
    torch.testing.assert_close(first, torch.tensor([1.0]))


@pytest.mark.parametrize("copy_", ["copyWeightsToHost", "copyWeightsToDevice"])
def test_copying_weights_before_compiling_is_poptorchs_error(copy_):
    model = poptorch.inferenceModel(Regressor())
    with pytest.raises(poptorch.Error, match="Model has not been compiled or has been destroyed."):
        getattr(model, copy_)()


class _RemovesItsBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("y", torch.tensor([2.0]))

    def forward(self, x):
        if "y" in self._buffers:
            del self._buffers["y"]
        return x + 1


class _ReassignsItsBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("y", torch.tensor([2.0]))

    def forward(self, x):
        self.y = self.y + x
        return x + 1


def test_removing_a_buffer_in_forward_is_poptorchs_error_and_the_module_keeps_it():
    model = _RemovesItsBuffer()
    with pytest.raises(poptorch.Error, match=r"Buffer y is removed from the model when calling the forward method\."):
        poptorch.inferenceModel(model)(torch.tensor([5.0]))
    assert "y" in model._buffers


def test_reassigning_a_buffer_in_forward_is_poptorchs_error_naming_copy_():
    model = _ReassignsItsBuffer()
    with pytest.raises(poptorch.Error, match=r"Buffer y is reassigned within the model .* self\.y\.copy_\(src\)"):
        poptorch.inferenceModel(model)(torch.tensor([5.0]))
    assert torch.equal(model.y, torch.tensor([2.0]))


def test_a_gradient_left_on_the_host_module_does_not_reach_the_first_update():
    """PopTorch's buffers_test trains its reference on the host module, then wraps that module: the IPU's
    accumulators start at zero, so the `.grad` the host loop left behind is not part of the first update."""
    from fixtures import LinearRegression

    model = LinearRegression()
    reference = copy.deepcopy(model)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    model(x, y)[1].backward()  # a stale gradient on the host module
    poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))(x, y)
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(x, y)[1].backward()
    sgd.step()
    torch.testing.assert_close(model.linear.weight, reference.linear.weight)
